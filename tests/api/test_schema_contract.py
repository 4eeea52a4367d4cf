"""The OpenAPI schema is the contract: schemathesis generates requests from ``/api/schema/``
and sends them to the real web server (daphne, with the shared Celery workers running what a
request starts), with every check it has on. The test fails on any 5xx, any answer whose
status, content type, headers or body the schema does not declare, any request that the
schema says is invalid and the server accepts (negative data), and any request that the
schema says is valid and the server refuses with a 400 (positive data).

Bounded, so that it stays a unit of ``make test``: a fixed seed, no shrinking, and
``MAX_EXAMPLES`` valid and ``MAX_EXAMPLES`` invalid requests per operation.

schemathesis's pytest plugin (``schema.parametrize()``) does not run under pytest 9 in the
pinned version, so the test drives schemathesis's Python API itself: one Hypothesis test per
operation and generation mode, built from ``operation.as_strategy()``, each request sent and
checked by ``case.call_and_validate()`` (every built-in check the schema's config enables).
"""

from __future__ import annotations

import time
from typing import Any

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, Phase, given
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok

from tests.conftest import Worker
from tests.factories import api_token
from tests.harness.net import fetch
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

SEED = 20261201
MAX_EXAMPLES = 10

# Operations left out, each with its reason.
EXCLUDED = {
    # Server-sent events: the answer is a stream that ends only when the client goes away, so
    # no request of it completes (tests/records and tests/cli follow it with real clients).
    ("GET", "/api/v1/records/{id}/logs/stream/"): "a live stream that never ends",
}
# Operations whose valid requests (by the schema) the server may still refuse with a 400,
# because what it checks there is data, not shape: positive_data_acceptance is off for these.
DATA_DEPENDENT = {
    # The inputs are checked against the pipeline's own input schema, one per pipeline.
    ("POST", "/api/v1/pipelines/{name}/runs/"): "inputs are checked against the pipeline's input schema",
    # The spec is checked against its kind's spec schema; kinds are a registry.
    ("POST", "/api/v1/records/"): "the spec is checked against its kind's spec schema",
    # A git source's URL, ref and sub-directory are checked by git's rules, its credential
    # against the namespace's secrets; a sync asks the repository, which may refuse it.
    ("POST", "/api/v1/sources/"): "the settings are checked by git's rules and against the secrets",
    ("PUT", "/api/v1/sources/{name}/"): "the settings are checked by git's rules and against the secrets",
    ("PATCH", "/api/v1/sources/{name}/"): "the settings are checked by git's rules and against the secrets",
    ("POST", "/api/v1/sources/{name}/sync/"): "a sync asks the repository, which may refuse it",
}


# The one request shape left out: a multipart body with no parts. Twisted (under daphne) parses
# a multipart body itself, before Graphene sees the request, and answers an empty one with a
# bare 400 (no body, no content type). Only an artifact upload takes multipart, and it needs
# its ``file`` part.
def _empty_multipart(case: Any) -> bool:
    return bool(case.media_type == "multipart/form-data" and not case.body)


def _config(ca_file: str) -> SchemathesisConfig:
    operations: list[dict[str, Any]] = [
        {"include-method": method, "include-path": path, "checks": {"positive_data_acceptance": {"enabled": False}}}
        for method, path in DATA_DEPENDENT
    ]
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            # No NUL characters: every door refuses them in any string (docs/api.md), a rule
            # tests/doors holds it to; here they would only hide what else a request tests.
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "database": "none", "allow-x00": False},
            "checks": {"enabled": True},
            "request-timeout": 30,
            "tls-verify": ca_file,  # the test web server's CA (tests.harness.tls)
            "operations": operations,
        }
    )


@pytest.fixture
def token(transactional_db: None) -> str:
    """A superuser's token: permissions refuse nothing, so that every operation is reached."""
    user = get_user_model().objects.create_superuser(username="contract", password="pw")
    return api_token(user)


def _failure(exc: BaseException) -> str:
    """The failure's report, with each line cut short (a reproducing curl can be kilobytes)."""
    parts = [str(exc), *(str(e) for e in getattr(exc, "exceptions", ()))]
    lines = [line if len(line) <= 400 else line[:400] + " ..." for part in parts for line in part.splitlines()]
    return "\n".join(lines)[:4000]


def test_every_operation_keeps_the_schemas_word(web: WebServer, workers: list[Worker], token: str) -> None:
    status, raw = fetch(f"{web.url}/api/schema/?format=json", token=token)
    assert status == 200, raw[:500]
    headers = {"Authorization": f"Token {token}"}
    schema = schemathesis.openapi.from_url(
        f"{web.url}/api/schema/?format=json", headers=headers, config=_config(str(web.ca_file))
    )
    failures: list[str] = []
    tested: list[str] = []
    unnegatable: list[str] = []
    took: list[tuple[float, str]] = []
    started = time.monotonic()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # every operation of the schema is one schemathesis can test
        operation = result.ok()
        key = (operation.method.upper(), operation.path)
        if key in EXCLUDED:
            continue
        tested.append(f"{key[0]} {key[1]}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.seed(SEED)
            @hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                phases=[Phase.generate],  # no shrinking: the first failing request is reported as it is
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                hypothesis.assume(not _empty_multipart(case))
                if case.meta.generation.mode.is_positive and case.query:
                    # A cursor is opaque: only one a next or previous link gave out is valid,
                    # which no schema can say (a made-up one is a 400, tests/doors checks it).
                    case.query.pop("cursor", None)
                case.call_and_validate(base_url=web.url, headers=headers)

            began = time.monotonic()
            try:
                check()
            except hypothesis.errors.Unsatisfiable:
                # Nothing of the operation can be invalid (no parameters, no body, a path
                # parameter any string satisfies): there is no negative request to send.
                assert mode is GenerationMode.NEGATIVE, key
                unnegatable.append(f"{key[0]} {key[1]}")
            except (Exception, BaseExceptionGroup) as exc:  # every operation is tried; all failures reported
                failures.append(f"--- {key[0]} {key[1]} ({mode.value}) ---\n{_failure(exc)}")
            took.append((time.monotonic() - began, f"{key[0]} {key[1]} {mode.value}"))
    elapsed = time.monotonic() - started
    # the bound is watched: make test -s shows it
    print(f"schemathesis: {len(tested)} operations ({len(unnegatable)} without invalid input), {elapsed:.1f}s")
    print("slowest:", ", ".join(f"{what} {seconds:.1f}s" for seconds, what in sorted(took)[-6:]))
    assert len(tested) >= 40, tested  # the schema lists the API (it did not come back empty)
    assert not failures, f"{len(failures)} failing operation(s):\n\n" + "\n\n".join(failures)
