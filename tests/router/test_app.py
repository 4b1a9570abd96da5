"""The router app through Flask's test client: events dispatched to the handlers that want
them, the body limit, handler failures as 500/503, probes, other routes, and the Kubernetes
access each worker makes (what a request may carry: ``test_parse.py``)."""

from __future__ import annotations

import io
import json
import logging
import os
from typing import Any

import pytest
from flask.testing import FlaskClient

from eventop.handlers.events import Event
from eventop.handlers.registry import Registry
from eventop.router.app import DEFAULT_MAX_BODY, KubeProvider, create_app
from eventop.router.logs import JsonFormatter
from tests.router.support import (
    HANDLERS,
    FakeKube,
    Recorder,
    binary,
    ce_headers,
    cloudevent,
    configmap,
    kube_event,
    metric,
    no_kube_configured,
    post,
    structured,
)

# -- handled events ----------------------------------------------------------------------------

def test_binary_mode_kube_event_reaches_the_handler_for_its_kind(
        client: FlaskClient, recorder: Recorder, fake_kube: FakeKube) -> None:
    obj = configmap("registry-config", "default", uid="u-1", resource_version="240")
    resp = post(client, binary(kube_event("update", obj)))
    assert resp.status_code == 200
    assert resp.get_json() == {"id": "u-1/240/update", "outcome": "ok", "handlers": [
        {"handler": f"{HANDLERS}.configmaps", "outcome": "ok",
         "detail": "converged"}]}
    [(name, event, kube)] = recorder.seen
    assert name == "configmaps" and kube is fake_kube
    assert event.id == "u-1/240/update"
    assert event.type == "dev.knative.apiserver.resource.update"
    assert event.source == "https://10.96.0.1:443"
    assert event.time == "2026-11-21T07:40:58Z"
    assert event.data == obj
    assert event.extensions == {"kind": "ConfigMap", "name": "registry-config",
                                "apiversion": "v1", "namespace": "default"}
    assert event.object == obj and event.change == "update"



def test_structured_mode_event_is_dispatched_like_binary_mode(
        client: FlaskClient, recorder: Recorder) -> None:
    obj = configmap("settings", "team-a")
    resp = post(client, structured(kube_event("add", obj, id_="s-1")))
    assert resp.status_code == 200, resp.get_json()
    [(name, event, _)] = recorder.seen
    assert (name, event.id, event.data) == ("configmaps", "s-1", obj)
    assert event.extensions["namespace"] == "team-a"



def test_reference_mode_event_reaches_the_handler_for_its_kind(
        client: FlaskClient, recorder: Recorder) -> None:
    rule = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
            "metadata": {"name": "main-rule", "uid": "r-1", "resourceVersion": "7"}}
    resp = post(client, binary(kube_event("delete", rule, mode="ref")))
    assert resp.status_code == 200
    [(name, event, _)] = recorder.seen
    assert name == "copy_rules"
    assert event.object is None and event.ref is not None and event.ref.name == "main-rule"



def test_events_path_is_an_alias_of_root(client: FlaskClient, recorder: Recorder) -> None:
    resp = post(client, binary(cloudevent("test.any", {"x": 1})), path="/events")
    assert resp.status_code == 200
    assert recorder.handlers() == ["any_data"]



def test_event_without_a_matching_handler_is_acknowledged_as_ignored(
        client: FlaskClient, recorder: Recorder) -> None:
    before = metric("eventop_events_total", type="dev.knative.apiserver.resource.add",
                    kind="Secret", outcome="ignored")
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "regcred", "namespace": "default", "uid": "s",
                           "resourceVersion": "1"},
              "data": {"token": "c2VjcmV0"}}
    resp = post(client, binary(kube_event("add", secret)))
    assert resp.status_code == 202
    body = resp.get_json()
    assert body["outcome"] == "ignored" and body["handlers"] == []
    assert "no handler registered for type 'dev.knative.apiserver.resource.add'" in body["detail"]
    assert "kind 'Secret'" in body["detail"]
    assert recorder.seen == []
    assert metric("eventop_events_total", type="dev.knative.apiserver.resource.add",
                  kind="Secret", outcome="ignored") == before + 1



@pytest.mark.parametrize("knative", [{"Prefer": "reply"},
                                     {"ce-knativearrivaltime": "2026-11-29T13:00:00Z"}],
                         ids=["prefer-reply", "broker-arrival-time"])
def test_a_knative_delivery_gets_2xx_answers_without_a_body_and_errors_with_one(
        client: FlaskClient, recorder: Recorder, knative: dict[str, str]) -> None:
    """A Knative Broker reads a 2xx answer's body as the reply event: one that is not a
    CloudEvent turns the delivery into a 502, retried and then dead-lettered, for every
    event the router handled or ignored."""
    headers, body = binary(kube_event("update", configmap("settings", "default")))
    handled = client.post("/", headers={**headers, **knative}, data=body)
    assert (handled.status_code, handled.data) == (200, b"")
    assert recorder.handlers() == ["configmaps"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "regcred", "namespace": "default", "uid": "s", "resourceVersion": "1"}}
    headers, body = binary(kube_event("add", secret))
    ignored = client.post("/", headers={**headers, **knative}, data=body)
    assert (ignored.status_code, ignored.data) == (202, b"")
    headers, body = binary(cloudevent("test.fail", {"a": 1}, id_="boom-2"))
    failed = client.post("/", headers={**headers, **knative}, data=body)
    assert failed.status_code == 500 and "the handler broke" in failed.get_json()["error"]
    plain = post(client, binary(kube_event("update", configmap("settings", "default"))))
    assert plain.status_code == 200 and plain.get_json()["outcome"] == "ok"


def test_ignored_event_needs_no_kubernetes_api(recorder: Recorder,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Any) -> None:
    no_kube_configured(monkeypatch, tmp_path)
    client = create_app(registry=recorder.registry).test_client()
    resp = post(client, binary(cloudevent("test.nobody.wants.this", {"a": 1})))
    assert resp.status_code == 202


# -- 413: the body limit -----------------------------------------------------------------------

def test_body_over_the_limit_is_rejected_with_413_naming_the_limit(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTOP_MAX_BODY_BYTES", "1024")
    client = create_app(registry=recorder.registry, kube=FakeKube()).test_client()
    obj = configmap(data={"big": "x" * 2000})
    resp = post(client, binary(kube_event("add", obj)))
    assert resp.status_code == 413
    assert resp.get_json()["error"] == (
        "request body is larger than the limit of 1024 bytes (raise EVENTOP_MAX_BODY_BYTES "
        "if such events are legitimate)")
    assert recorder.seen == []



@pytest.mark.parametrize(("size", "status"), [(5000, 413), (1024, 202), (1000, 202)])
def test_chunked_body_is_held_to_the_same_limit(recorder: Recorder,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 size: int, status: int) -> None:
    """Without Content-Length, Werkzeug would hand over the first bytes as the whole body."""
    monkeypatch.setenv("EVENTOP_MAX_BODY_BYTES", "1024")
    client = create_app(registry=recorder.registry, kube=FakeKube()).test_client()
    body = b'"' + b"x" * (size - 2) + b'"'
    resp = client.post("/", headers=ce_headers(ce_type="test.nobody"),
                       input_stream=io.BytesIO(body),
                       environ_overrides={"wsgi.input_terminated": True})  # as gunicorn does
    assert resp.status_code == status
    if status == 413:
        assert resp.get_json()["error"].startswith(
            "request body is larger than the limit of 1024 bytes")



def test_default_limit_accepts_the_largest_kubernetes_object(client: FlaskClient,
                                                             recorder: Recorder) -> None:
    assert DEFAULT_MAX_BODY == 8 * 1024 * 1024
    obj = configmap(data={"big": "x" * (1536 * 1024)})  # etcd's 1.5 MiB object limit
    resp = post(client, binary(kube_event("add", obj)))
    assert resp.status_code == 200
    assert recorder.seen[0][1].data == obj



def test_invalid_body_limit_setting_is_reported(recorder: Recorder,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTOP_MAX_BODY_BYTES", "8MiB")
    with pytest.raises(ValueError, match="EVENTOP_MAX_BODY_BYTES must be a number of bytes, "
                                         "not '8MiB'"):
        create_app(registry=recorder.registry, kube=FakeKube())


# -- handler failures --------------------------------------------------------------------------

def test_handler_exception_is_500_naming_event_and_handler_and_others_still_run(
        client: FlaskClient, recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    resp = post(client, binary(cloudevent("test.fail", {"a": 1}, id_="boom-1")))
    assert resp.status_code == 500
    body = resp.get_json()
    assert body["id"] == "boom-1" and body["outcome"] == "error"
    assert body["error"] == ("event boom-1: handler(s) failed: "
                             f"{HANDLERS}.fails: "
                             "RuntimeError: the handler broke")
    assert [h["outcome"] for h in body["handlers"]] == ["error", "ok"]
    assert recorder.handlers() == ["survives"]
    [failure] = [r for r in caplog.records if r.levelno == logging.ERROR
                 and r.getMessage().startswith("handler ")]
    assert "boom-1" in failure.getMessage()
    assert failure.exc_info is not None and failure.exc_info[0] is RuntimeError
    line = json.loads(JsonFormatter().format(failure))
    assert line["id"] == "boom-1"
    assert "RuntimeError: the handler broke" in line["traceback"]
    assert 'in fails' in line["traceback"]
    # the app keeps answering after the failure
    assert post(client, binary(cloudevent("test.any", {"a": 1}))).status_code == 200



def test_handler_reporting_api_unavailable_is_503_so_the_sender_retries(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    resp = post(client, binary(cloudevent("test.unavailable", {}, id_="down-1")))
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["outcome"] == "unavailable"
    assert body["error"].startswith("event down-1: handler(s) failed: ")
    assert "api_down: Unavailable: Kubernetes API unreachable (test)" in body["error"]
    # one line saying what is unavailable, no traceback (it is a condition, not a bug)
    [failure] = [r for r in caplog.records if r.levelno == logging.ERROR
                 and r.getMessage().startswith("handler ")]
    assert "Kubernetes API unreachable (test)" in failure.getMessage()
    assert failure.exc_info is None



def test_a_cache_still_catching_up_is_a_503_logged_as_a_warning_not_an_error(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    """A CRD just installed or a watch resuming after an API-server restart: the resend
    finds the cache caught up, nothing is wrong, so nothing is logged at ERROR."""
    caplog.set_level(logging.INFO, logger="eventop")
    resp = post(client, binary(cloudevent("test.behind", {}, id_="behind-1")))
    assert resp.status_code == 503
    assert resp.get_json()["outcome"] == "unavailable"
    lines = [r for r in caplog.records if "behind-1" in r.getMessage()
             or getattr(r, "fields", {}).get("id") == "behind-1"]
    assert [r.levelno for r in lines if r.levelno >= logging.WARNING] == [logging.WARNING] * 2
    assert any("did not reach resourceVersion 7" in r.getMessage() for r in lines)


def test_other_kubernetes_errors_are_500_logged_in_one_line_without_a_traceback(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    """The API server's answer (a 404, an RBAC 403) says it all: a traceback per retried
    event would bury it (a reviewer counted 159 in three short RBAC outages)."""
    caplog.set_level(logging.INFO, logger="eventop")
    resp = post(client, binary(cloudevent("test.notfound", {}, id_="nf-1")))
    assert resp.status_code == 500
    assert "not_found: NotFound: 404 NotFound" in resp.get_json()["error"]
    [failure] = [r for r in caplog.records if r.levelno == logging.ERROR
                 and r.getMessage().startswith("handler ")]
    assert "404 NotFound" in failure.getMessage() and failure.exc_info is None



def test_no_kubernetes_configured_is_503_when_a_handler_needs_the_api(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    no_kube_configured(monkeypatch, tmp_path)
    client = create_app(registry=recorder.registry).test_client()
    resp = post(client, binary(cloudevent("test.any", {"a": 1}, id_="nokube")))
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["id"] == "nokube"
    assert "no Kubernetes API configured" in body["error"]
    assert recorder.seen == []



def test_unexpected_router_error_is_a_json_500_and_the_app_keeps_serving(
        fake_kube: FakeKube) -> None:
    class BrokenRegistry(Registry):
        def run(self, matched: Any, event: Event, kube: Any) -> list[Any]:
            raise RuntimeError("registry exploded")

    registry = BrokenRegistry()
    registry.on("test.any")(lambda event, kube: None)
    client = create_app(registry=registry, kube=fake_kube).test_client()
    resp = post(client, binary(cloudevent("test.any", {})))
    assert resp.status_code == 500
    assert resp.get_json() == {
        "id": "event-1", "outcome": "error", "handlers": [],
        "error": "event event-1: dispatch failed: RuntimeError: registry exploded"}
    assert client.get("/healthz").status_code == 200



def test_unexpected_error_outside_dispatch_is_a_json_500(fake_kube: FakeKube,
                                                         recorder: Recorder) -> None:
    app = create_app(registry=recorder.registry, kube=fake_kube)
    app.extensions["eventop"]["readiness"].check = lambda: 1 / 0
    resp = app.test_client().get("/readyz")
    assert resp.status_code == 500
    assert resp.get_json() == {"error": "internal error: ZeroDivisionError: division by zero"}


# -- probes and other routes -------------------------------------------------------------------

def test_healthz_answers_without_the_kubernetes_api(recorder: Recorder) -> None:
    client = create_app(registry=recorder.registry, kube=FakeKube(reachable=False)).test_client()
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.get_json() == {"status": "alive"}



def test_readyz_is_200_when_the_api_answers(client: FlaskClient) -> None:
    resp = client.get("/readyz")
    assert resp.status_code == 200
    assert resp.get_json() == {"ready": True,
                               "reason": "Kubernetes API reachable at http://fake-api"}



def test_readyz_is_503_with_the_reason_when_the_api_is_down(recorder: Recorder) -> None:
    client = create_app(registry=recorder.registry, kube=FakeKube(reachable=False)).test_client()
    resp = client.get("/readyz")
    assert resp.status_code == 503
    assert resp.get_json() == {
        "ready": False, "reason": "version /version: Kubernetes API unreachable at "
                                  "http://fake-api"}



def test_readyz_names_a_missing_crd_and_the_handler_waiting_for_it_without_going_unready(
        recorder: Recorder) -> None:
    """No event of a kind the API server does not serve can arrive, and the other handlers
    must keep running: a missing CRD is named (with who needs it), not a reason to stop."""
    kube = FakeKube(crds_installed=False)
    app = create_app(registry=recorder.registry, kube=kube)
    app.extensions["eventop"]["readiness"].ttl = 0.0
    client = app.test_client()
    resp = client.get("/readyz")
    assert resp.status_code == 200
    assert resp.get_json()["reason"] == (
        "Kubernetes API reachable at http://fake-api; "
        f"{HANDLERS}.copy_rules wait(s) for the "
        "CustomResourceDefinitions of CopyRule.eventop.dev/v1: install them with "
        "`kubectl apply -k crds/`")
    kube.crds_installed = True
    assert client.get("/readyz").get_json()["reason"] == \
        "Kubernetes API reachable at http://fake-api"



def test_readyz_reuses_a_recent_ping(recorder: Recorder) -> None:
    kube = FakeKube()
    app = create_app(registry=recorder.registry, kube=kube)
    app.extensions["eventop"]["readiness"].ttl = 3600.0
    client = app.test_client()
    assert [client.get("/readyz").status_code for _ in range(5)] == [200] * 5
    assert kube.pings == 1



def test_readyz_pings_again_once_the_cached_answer_expired(recorder: Recorder) -> None:
    kube = FakeKube(reachable=False)
    app = create_app(registry=recorder.registry, kube=kube)
    app.extensions["eventop"]["readiness"].ttl = 0.0
    client = app.test_client()
    assert client.get("/readyz").status_code == 503
    kube.reachable = True
    assert client.get("/readyz").status_code == 200
    assert kube.pings == 2



def test_readyz_makes_no_request_when_the_api_answered_another_one_just_now(
        recorder: Recorder) -> None:
    """Probes every 5 s cost each replica 24 requests a minute (a ping and a discovery each):
    more than its watches and its Lease together (a trial's count on a real API server)."""
    kube = FakeKube()
    kube.answered_recently = True
    app = create_app(registry=recorder.registry, kube=kube)
    app.extensions["eventop"]["readiness"].ttl = 0.0
    client = app.test_client()
    assert [client.get("/readyz").status_code for _ in range(5)] == [200] * 5
    assert (kube.pings, kube.discoveries) == (0, 1)  # once all CRDs are served, once a minute
    kube.answered_recently = False
    assert client.get("/readyz").status_code == 200
    assert kube.pings == 1


def test_a_real_client_knows_when_the_api_server_last_answered(kube: Any) -> None:
    from eventop.kube import Kube, errors

    fresh = Kube.connect(url=kube.host)
    assert not fresh.answered_within(10.0)
    with pytest.raises(errors.NotFound):  # an answer all the same
        fresh.get("v1", "ConfigMap", "nowhere", "default")
    assert fresh.answered_within(10.0)
    assert fresh.for_manager("other").answered_within(10.0)  # one API server for all
    unreachable = Kube.connect(url="http://127.0.0.1:9")
    with pytest.raises(errors.Unavailable):
        unreachable.ping()
    assert not unreachable.answered_within(10.0)
    fresh._answered[1] = fresh._answered[0] + 1  # a request failed since the answer
    assert not fresh.answered_within(10.0)


def test_readyz_is_503_when_no_kubernetes_api_is_configured(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    no_kube_configured(monkeypatch, tmp_path)
    resp = create_app(registry=recorder.registry).test_client().get("/readyz")
    assert resp.status_code == 503
    assert "no Kubernetes API configured" in resp.get_json()["reason"]



def test_unknown_path_and_wrong_method_answer_json(client: FlaskClient) -> None:
    resp = client.get("/nope")
    assert resp.status_code == 404 and resp.get_json()["error"].startswith("Not Found")
    resp = client.get("/")
    assert resp.status_code == 405
    assert resp.get_json()["error"].startswith("Method Not Allowed")


# -- Kubernetes access per worker --------------------------------------------------------------

def test_kube_is_connected_lazily_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop import kube

    made: list[int] = []

    def connect() -> object:
        made.append(1)
        return object()

    monkeypatch.setattr(kube.Kube, "connect", staticmethod(connect))
    provider = KubeProvider()
    assert made == []
    first = provider.get()
    assert provider.get() is first and len(made) == 1
    pid = os.fork()  # as gunicorn forks a worker
    if pid == 0:
        os._exit(0 if provider.get() is not first and len(made) == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child reused its parent's"
    assert provider.get() is first and len(made) == 1
