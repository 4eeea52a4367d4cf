"""The one place that reads the environment for settings.

Every setting Graphene reads from the environment is named ``GRAPHENE_*`` and goes through
``env``. Parsing failures raise ``ImproperlyConfigured`` with a one-line message that names
the variable, so the ``graphene`` command can print it without a traceback.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Env:
    """Typed accessors over ``os.environ``."""

    def string(self, name: str, default: str | None = None) -> str | None:
        value = os.environ.get(name)
        return default if value is None or value == "" else value

    def required(self, name: str, hint: str) -> str:
        value = os.environ.get(name, "")
        if not value:
            raise ImproperlyConfigured(f"{name} is not set: {hint}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        raw = os.environ.get(name)
        if raw is None:
            return default
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no")

    def integer(self, name: str, default: int) -> int:
        raw = os.environ.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None

    def number(self, name: str, default: float) -> float:
        raw = os.environ.get(name)
        if raw is None or raw == "":
            return default
        try:
            return float(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None

    def csv(self, name: str, default: list[str]) -> list[str]:
        raw = os.environ.get(name)
        if raw is None:
            return default
        return [item.strip() for item in raw.split(",") if item.strip()]


env = Env()

_PG_SCHEMES = {"postgres", "postgresql", "pgsql", "postgresql+psycopg"}


def database_from_url(
    url: str,
    *,
    setting: str = "GRAPHENE_DATABASE_URL",
    pool: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Translate ``postgresql://user:password@host:port/name?opt=v`` into a Django DATABASES entry.

    Only PostgreSQL is accepted: production mode needs row locks and ``SKIP LOCKED``. With
    ``pool`` (psycopg_pool's options) connections are borrowed from a pool of this process and
    given back at the end of each request; the URL's ``conn_max_age`` is then ignored, as
    Django's pool refuses persistent connections.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting} is not a valid URL: {exc}") from None
    if parts.scheme not in _PG_SCHEMES:
        raise ImproperlyConfigured(
            f"{setting} has scheme {parts.scheme or '(none)'!r}; use postgresql://user:password@host:5432/name"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(f"{setting} names no database; use postgresql://user:password@host:5432/name")
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    try:
        conn_max_age = int(options.pop("conn_max_age", "60"))
        connect_timeout = int(options.pop("connect_timeout", "5"))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting} has a non-integer option: {exc}") from None
    if pool is not None:
        options["pool"] = pool
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        # An empty host means the local Unix socket, as with libpq.
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(port or ""),
        "CONN_MAX_AGE": 0 if pool is not None else conn_max_age,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {"connect_timeout": connect_timeout, **options},
    }


def pool_options(*, min_size: int, max_size: int, timeout: int, name: str) -> dict[str, Any]:
    """psycopg_pool's options for Django's pool, refusing bounds that cannot work (naming the setting)."""
    if max_size < 1:
        raise ImproperlyConfigured(f"GRAPHENE_WEB_DB_POOL_MAX={max_size} must be at least 1")
    if not 0 <= min_size <= max_size:
        raise ImproperlyConfigured(
            f"GRAPHENE_WEB_DB_POOL_MIN={min_size} must be between 0 and GRAPHENE_WEB_DB_POOL_MAX ({max_size})"
        )
    if timeout < 1:
        raise ImproperlyConfigured(f"GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS={timeout} must be at least 1")
    return {"min_size": min_size, "max_size": max_size, "timeout": float(timeout), "name": name}


def check_broker_url(url: str, *, setting: str = "GRAPHENE_BROKER_URL") -> str:
    """Refuse broker URLs Graphene does not support, naming the setting."""
    scheme = urlsplit(url).scheme
    if scheme not in {"redis", "rediss", "amqp", "amqps", "pyamqp", "memory"}:
        raise ImproperlyConfigured(
            f"{setting} has scheme {scheme or '(none)'!r}; use redis://host:6379/0 or amqp://user:pass@host:5672//"
        )
    return url


def check_redis_url(url: str, *, setting: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{setting} has scheme {scheme or '(none)'!r}; use redis://host:6379/1")
    return url


def trusted_networks(items: list[str], *, setting: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``10.0.0.5,10.1.0.0/16,::1`` as networks (an address is a network of one), naming the setting."""
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{setting}: {item!r} is not an IP address or network; use e.g. 10.0.0.5 or 10.0.0.0/8"
            ) from None
    return tuple(networks)
