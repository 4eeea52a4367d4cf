"""Listings of a command group (``secret list``, ``source list``, ``namespace list``…): every
page up to ``--limit``, a hint when more exist, the namespace column when several show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphenectl._output import Column, Format, emit, info
from graphenectl._resources import namespace_columns
from graphenectl._session import session


def listed(path: str, params: dict[str, Any], *, limit: int, plural: str) -> list[dict[str, Any]]:
    """Every page (following ``next``) up to ``limit`` items, with a hint when more exist."""
    items, more = session.client().list(path, params, limit=limit)
    if more:
        info(f"showing the first {len(items)} {plural}; more exist (--limit N shows more)")
    return items


def namespaced(
    path: str,
    *,
    plural: str,
    columns: list[Column],
    name_of: Callable[[dict[str, Any]], str],
    namespace: str | None,
    all_namespaces: bool,
    limit: int,
    output: Format,
) -> None:
    """List ``path`` in the namespace chosen (``-n``, the environment, the context) or, with
    ``-A`` or none chosen, in every namespace the caller may read, a NAMESPACE column first."""
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    chosen = session.list_namespace()
    items = listed(path, {"namespace": chosen}, limit=limit, plural=plural)
    if not items and output in (Format.table, Format.wide):
        info(f"no {plural} found" + (f" in namespace {chosen!r}" if chosen else ""))
        return
    emit(items, output, columns=namespace_columns(columns, chosen), name_of=name_of)
