"""The secret store over REST: values go in and never come out; every refusal names its field."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.secrets.models import Secret
from apps.secrets.services import MAX_VALUE_BYTES, secret_resolve
from tests import factories

pytestmark = pytest.mark.django_db

VALUE = "-----BEGIN KEY-----\nc3VwZXItc2VjcmV0LXZhbHVlLTQyCg==\n-----END KEY-----\n"


@pytest.fixture
def keeper(django_user_model: Any) -> APIClient:
    """A developer: stores, replaces and deletes secrets and lists their names."""
    user = django_user_model.objects.create_user(username="keeper", password="pw")
    factories.bind(user, "developer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_create_list_get_replace_delete_without_ever_returning_a_value(keeper: APIClient) -> None:
    created = keeper.post("/api/v1/secrets/", {"name": "deploy-key", "value": VALUE}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["name"] == "deploy-key"
    assert created.json()["created_by"] == "keeper"
    assert secret_resolve(name="deploy-key") == VALUE  # stored exactly, final newline included

    listed = keeper.get("/api/v1/secrets/")
    assert listed.status_code == 200
    rows = listed.json()["results"]
    assert [row["name"] for row in rows] == ["deploy-key"]
    assert set(rows[0]) == {"name", "namespace", "created_at", "updated_at", "created_by", "updated_by", "key_id"}
    assert keeper.get("/api/v1/secrets/deploy-key/").json()["name"] == "deploy-key"

    taken = keeper.post("/api/v1/secrets/", {"name": "deploy-key", "value": "other"}, format="json")
    assert taken.status_code == 409
    assert "PUT /api/v1/secrets/deploy-key/" in taken.json()["detail"]
    assert secret_resolve(name="deploy-key") == VALUE

    replaced = keeper.put("/api/v1/secrets/deploy-key/", {"value": "rotated"}, format="json")
    assert replaced.status_code == 200
    assert secret_resolve(name="deploy-key") == "rotated"
    made = keeper.put("/api/v1/secrets/db.password/", {"value": "pw"}, format="json")
    assert made.status_code == 201
    assert keeper.patch("/api/v1/secrets/db.password/", {"value": "x"}, format="json").status_code == 405

    for response in (created, listed, replaced, made, keeper.get("/api/v1/secrets/deploy-key/")):
        assert VALUE not in response.content.decode()
        assert "rotated" not in response.content.decode()

    assert keeper.delete("/api/v1/secrets/deploy-key/").status_code == 204
    assert keeper.delete("/api/v1/secrets/deploy-key/").status_code == 404
    assert keeper.get("/api/v1/secrets/deploy-key/").status_code == 404
    assert [row["name"] for row in keeper.get("/api/v1/secrets/").json()["results"]] == ["db.password"]


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name": "", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "-leading-dash", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "trailing.", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "has space", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "a/b", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "ünïcode", "value": "v"}, "name", "not a valid secret name"),
        ({"name": "x" * 129, "value": "v"}, "name", "not a valid secret name"),
        ({"name": 42, "value": "v"}, "name", "Not a valid string"),
        ({"value": "v"}, "name", "required"),
        ({"name": "ok"}, "value", "required"),
        ({"name": "ok", "value": ""}, "value", "must not be empty"),
        ({"name": "ok", "value": 5}, "value", "Not a valid string"),
        ({"name": "ok", "value": "x" * (MAX_VALUE_BYTES + 1)}, "value", f"at most {MAX_VALUE_BYTES} bytes"),
        ({"name": "ok", "value": "v", "vaule": "typo"}, "vaule", "unknown field"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(keeper: APIClient, body: dict[str, Any], field: str, says: str) -> None:
    response = keeper.post("/api/v1/secrets/", body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["error"] == "validation_failed"
    assert list(answer["fields"]) == [field]
    assert says in " ".join(answer["fields"][field])
    assert not Secret.objects.exists()


def test_a_bad_name_in_the_path_is_a_400(keeper: APIClient) -> None:
    response = keeper.put("/api/v1/secrets/-bad-/", {"value": "v"}, format="json")
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["name"]


def test_the_longest_name_and_the_largest_value_are_accepted(keeper: APIClient) -> None:
    name = "a" + "b" * 126 + "c"
    response = keeper.post("/api/v1/secrets/", {"name": name, "value": "é" * (MAX_VALUE_BYTES // 2)}, format="json")
    assert response.status_code == 201, response.content
    assert secret_resolve(name=name) == "é" * (MAX_VALUE_BYTES // 2)


def test_secrets_need_their_own_permissions(viewer_api: APIClient, keeper: APIClient) -> None:
    """A viewer reads runs and records but not even the names of secrets."""
    api = viewer_api
    keeper.post("/api/v1/secrets/", {"name": "deploy-key", "value": VALUE}, format="json")
    assert api.get("/api/v1/secrets/").status_code == 403
    assert api.get("/api/v1/secrets/deploy-key/").status_code == 403
    assert api.post("/api/v1/secrets/", {"name": "n", "value": "v"}, format="json").status_code == 403
    assert api.put("/api/v1/secrets/deploy-key/", {"value": "v"}, format="json").status_code == 403
    assert api.delete("/api/v1/secrets/deploy-key/").status_code == 403
    assert APIClient().get("/api/v1/secrets/").status_code in (401, 403)
    assert secret_resolve(name="deploy-key") == VALUE


def test_the_schema_documents_secrets_without_a_value_in_any_answer(keeper: APIClient) -> None:
    schema = keeper.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/secrets/" in schema["paths"]
    output = schema["components"]["schemas"]["SecretOutput"]["properties"]
    assert "value" not in output
    assert "ciphertext" not in output
