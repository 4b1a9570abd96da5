"""Optional shared-token authentication (EVENTOP_ROUTER_TOKEN): off by default; when set, an
event without the right bearer token is refused with 401 and reaches no handler."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from eventop.handlers.events import Event
from eventop.handlers.registry import Registry
from eventop.router import auth
from eventop.router.app import create_app
from tests.router.support import binary, cloudevent

TOKEN = "s3cret-token-of-32-characters-xx"


class _Ok:
    host = "http://fake-api"

    def ping(self) -> None:
        pass

    def answered_within(self, seconds: float) -> bool:
        return False

    def missing_kinds(self, kinds: Any) -> list[str]:
        return []


@pytest.fixture
def handled() -> list[str]:
    return []


def _client(handled: list[str]) -> FlaskClient:
    registry = Registry()

    @registry.on("test.*")
    def record(event: Event, kube: Any) -> str:
        handled.append(event.id)
        return "ok"
    return create_app(registry=registry, kube=_Ok()).test_client()


def _post(client: FlaskClient, authorization: str | None, id_: str) -> Any:
    headers, body = binary(cloudevent("test.any", {"a": 1}, id_=id_))
    if authorization is not None:
        headers["Authorization"] = authorization
    return client.post("/", headers=headers, data=body)


def test_without_a_configured_token_events_need_no_authorization(
        monkeypatch: pytest.MonkeyPatch, handled: list[str]) -> None:
    monkeypatch.delenv(auth.ENV, raising=False)
    assert _post(_client(handled), None, "e1").status_code == 200
    assert handled == ["e1"]


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN])
def test_an_event_without_the_right_token_is_refused_and_handled_by_nobody(
        monkeypatch: pytest.MonkeyPatch, handled: list[str], authorization: str | None) -> None:
    monkeypatch.setenv(auth.ENV, TOKEN)
    resp = _post(_client(handled), authorization, "forged")
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert auth.ENV in resp.get_json()["error"]
    assert TOKEN not in resp.get_data(as_text=True)
    assert handled == []


def test_the_right_token_is_accepted_and_probes_stay_open(
        monkeypatch: pytest.MonkeyPatch, handled: list[str]) -> None:
    monkeypatch.setenv(auth.ENV, TOKEN)
    client = _client(handled)
    assert _post(client, f"Bearer {TOKEN}", "e1").status_code == 200
    assert _post(client, f"bearer  {TOKEN} ", "e2").status_code == 200
    assert handled == ["e1", "e2"]
    for path in ("/healthz", "/readyz", "/metrics"):  # kubelet and Prometheus send no token
        assert client.get(path).status_code == 200


def test_senders_add_the_bearer_header_only_when_a_token_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.ENV, raising=False)
    assert auth.bearer_header() == {}
    monkeypatch.setenv(auth.ENV, f" {TOKEN}\n")  # as read from a Secret file with a newline
    assert auth.bearer_header() == {"Authorization": f"Bearer {TOKEN}"}
