"""The router app through Flask's test client: dispatch, responses, bad input, probes, metrics."""

from __future__ import annotations

import io
import json
import logging
import os
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from eventop.handlers.events import Event
from eventop.handlers.registry import Registry
from eventop.kube.errors import NotFound, Unavailable
from eventop.router.app import DEFAULT_MAX_BODY, KubeProvider, create_app
from eventop.router.logs import JsonFormatter
from tests.router.support import (
    binary,
    cloudevent,
    configmap,
    kube_event,
    structured,
)


class FakeKube:
    """Stands in for ``eventop.kube.Kube`` where only ``ping`` and discovery matter."""

    host = "http://fake-api"

    def __init__(self, reachable: bool = True, crds_installed: bool = True) -> None:
        self.reachable = reachable
        self.crds_installed = crds_installed
        self.pings = 0

    def ping(self) -> None:
        self.pings += 1
        if not self.reachable:
            raise Unavailable("version /version: Kubernetes API unreachable at http://fake-api")

    def missing_kinds(self, kinds: set[tuple[str, str]]) -> list[str]:
        return [] if self.crds_installed else sorted(f"{k}.{v}" for v, k in kinds)


class Recorder:
    """A registry whose handlers remember what they were given."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.seen: list[tuple[str, Event, Any]] = []
        on = self.registry.on

        @on("dev.knative.apiserver.*", api_version="v1", kind="ConfigMap")
        def configmaps(event: Event, kube: Any) -> str:
            self.seen.append(("configmaps", event, kube))
            return "converged"

        @on("dev.knative.apiserver.*", api_version="eventop.dev/v1", kind="CopyRule")
        def copy_rules(event: Event, kube: Any) -> None:
            self.seen.append(("copy_rules", event, kube))

        @on("test.any")
        def any_data(event: Event, kube: Any) -> None:
            self.seen.append(("any_data", event, kube))

        @on("test.fail")
        def fails(event: Event, kube: Any) -> None:
            raise RuntimeError("the handler broke")

        @on("test.fail", "test.unavailable")
        def survives(event: Event, kube: Any) -> str:
            self.seen.append(("survives", event, kube))
            return "still ran"

        @on("test.unavailable")
        def api_down(event: Event, kube: Any) -> None:
            raise Unavailable("Kubernetes API unreachable (test)")

        @on("test.notfound")
        def not_found(event: Event, kube: Any) -> None:
            raise NotFound("configmaps \"x\" not found", reason="NotFound")

    def handlers(self) -> list[str]:
        return [name for name, _, _ in self.seen]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fake_kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def client(recorder: Recorder, fake_kube: FakeKube) -> FlaskClient:
    return create_app(registry=recorder.registry, kube=fake_kube).test_client()


def post(client: FlaskClient, message: tuple[dict[str, str], bytes], path: str = "/") -> Any:
    headers, body = message
    return client.post(path, headers=headers, data=body)


def ce_headers(**overrides: str | None) -> dict[str, str]:
    headers = {"ce-id": "event-1", "ce-source": "/tests", "ce-type": "test.any",
               "ce-specversion": "1.0", "Content-Type": "application/json"}
    for key, value in overrides.items():
        name = key.replace("_", "-")
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- handled events ---------------------------------------------------------------------

def test_binary_mode_kube_event_reaches_the_handler_for_its_kind(
        client: FlaskClient, recorder: Recorder, fake_kube: FakeKube) -> None:
    obj = configmap("registry-config", "default", uid="u-1", resource_version="240")
    resp = post(client, binary(kube_event("update", obj)))
    assert resp.status_code == 200
    assert resp.get_json() == {"id": "u-1/240/update", "outcome": "ok", "handlers": [
        {"handler": f"{__name__}.Recorder.__init__.<locals>.configmaps", "outcome": "ok",
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


def test_structured_mode_accepts_data_base64_json(client: FlaskClient,
                                                  recorder: Recorder) -> None:
    body = json.dumps({"specversion": "1.0", "id": "b64", "source": "/t", "type": "test.any",
                       "datacontenttype": "application/json",
                       "data_base64": "eyJhIjogMX0="}).encode()  # {"a": 1}
    resp = client.post("/", data=body, content_type="application/cloudevents+json")
    assert resp.status_code == 200
    assert recorder.seen[0][1].data == {"a": 1}


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


def test_body_that_is_a_json_string_is_valid_json_data(client: FlaskClient,
                                                       recorder: Recorder) -> None:
    resp = client.post("/", headers=ce_headers(), data=b'"just a string"')
    assert resp.status_code == 200
    assert recorder.seen[0][1].data == "just a string"


def test_non_json_content_type_passes_text_data_through(client: FlaskClient,
                                                        recorder: Recorder) -> None:
    resp = client.post("/", headers=ce_headers(Content_Type="text/plain"), data=b"hello")
    assert resp.status_code == 200
    assert recorder.seen[0][1].data == "hello"


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


def test_ignored_event_needs_no_kubernetes_api(recorder: Recorder,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Any) -> None:
    _no_kube_configured(monkeypatch, tmp_path)
    client = create_app(registry=recorder.registry).test_client()
    resp = post(client, binary(cloudevent("test.nobody.wants.this", {"a": 1})))
    assert resp.status_code == 202


# -- malformed events: 400 ----------------------------------------------------------------

@pytest.mark.parametrize("attribute", ["id", "source", "type", "specversion"])
def test_binary_event_missing_a_required_attribute_is_rejected_naming_it(
        client: FlaskClient, recorder: Recorder, attribute: str) -> None:
    resp = client.post("/", headers=ce_headers(**{f"ce_{attribute}": None}), data=b"{}")
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error == ("missing or empty required CloudEvents attribute(s): "
                     f"'{attribute}' (header ce-{attribute})")
    assert recorder.seen == []


def test_binary_event_missing_several_attributes_names_them_all(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(ce_id=None, ce_type=None), data=b"{}")
    assert resp.status_code == 400
    assert "'id' (header ce-id), 'type' (header ce-type)" in resp.get_json()["error"]


def test_binary_event_with_empty_id_is_rejected(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(ce_id=""), data=b"{}")
    assert resp.status_code == 400
    assert "'id' (header ce-id)" in resp.get_json()["error"]


@pytest.mark.parametrize("attribute", ["id", "source", "type", "specversion"])
def test_structured_event_missing_a_required_attribute_is_rejected_naming_it(
        client: FlaskClient, attribute: str) -> None:
    doc = {"specversion": "1.0", "id": "e", "source": "/s", "type": "test.any", "data": {}}
    del doc[attribute]
    resp = client.post("/", data=json.dumps(doc), content_type="application/cloudevents+json")
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        f"missing or empty required CloudEvents attribute(s): '{attribute}'")


@pytest.mark.parametrize("version", ["0.3", "2.0", "1"])
def test_unknown_specversion_is_rejected(client: FlaskClient, version: str) -> None:
    resp = client.post("/", headers=ce_headers(ce_specversion=version), data=b"{}")
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        f"unsupported specversion '{version}': this router accepts CloudEvents 1.0")


def test_unknown_specversion_in_structured_mode_is_rejected(client: FlaskClient) -> None:
    doc = {"specversion": "0.2", "id": "e", "source": "/s", "type": "test.any"}
    resp = client.post("/", data=json.dumps(doc), content_type="application/cloudevents+json")
    assert resp.status_code == 400
    assert "unsupported specversion '0.2'" in resp.get_json()["error"]


def test_invalid_json_data_is_rejected_although_the_sdk_would_accept_it(
        client: FlaskClient, recorder: Recorder) -> None:
    resp = client.post("/", headers=ce_headers(), data=b'{"apiVersion": "v1", "kind": ')
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error.startswith("data is not valid JSON (datacontenttype is 'application/json'): ")
    assert "Expecting value" in error
    assert resp.get_json()["id"] == "event-1"
    assert recorder.seen == []


def test_invalid_json_without_content_type_says_json_was_assumed(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(Content_Type=None), data=b"{nope")
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith(
        "data is not valid JSON (no Content-Type was given, so JSON is assumed)")


def test_non_utf8_json_data_is_rejected(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(), data=b"\xff\xfe{}")
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith("data is not valid JSON")


def test_structured_body_that_is_not_json_is_rejected(client: FlaskClient) -> None:
    resp = client.post("/", data=b"{not json", content_type="application/cloudevents+json")
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith("structured-mode body is not valid JSON: ")


def test_structured_body_that_is_not_an_object_is_rejected(client: FlaskClient) -> None:
    resp = client.post("/", data=b"[1, 2]", content_type="application/cloudevents+json")
    assert resp.status_code == 400
    assert resp.get_json()["error"] == ("structured-mode body must be a JSON object with the "
                                        "event's attributes, got list")


@pytest.mark.parametrize(("body", "what"), [
    (b'["a", "list"]', "list data"), (b'"a string"', "str data"), (b"42", "int data"),
    (b"", "no data"),
])
def test_kubernetes_event_with_non_object_data_is_rejected(
        client: FlaskClient, body: bytes, what: str) -> None:
    headers = ce_headers(ce_type="dev.knative.apiserver.resource.add")
    resp = client.post("/", headers=headers, data=body)
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        "a dev.knative.apiserver.resource.add event needs a JSON object as data (the "
        f"Kubernetes object, or an ObjectReference in Reference mode), got {what}")


@pytest.mark.parametrize(("obj", "missing"), [
    ({"kind": "ConfigMap", "metadata": {"name": "x"}}, "apiVersion"),
    ({"apiVersion": "v1", "metadata": {"name": "x"}}, "kind"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}, "metadata.name"),
    ({"apiVersion": "v1", "kind": "ConfigMap"}, "metadata.name"),
    ({"data": {}}, "apiVersion, kind, metadata.name"),
])
def test_resource_mode_data_that_is_not_a_kubernetes_object_is_rejected(
        client: FlaskClient, obj: dict[str, Any], missing: str) -> None:
    headers = ce_headers(ce_type="dev.knative.apiserver.resource.update")
    resp = client.post("/", headers=headers, data=json.dumps(obj))
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        f"Resource-mode data is not a Kubernetes object: missing {missing}")


def test_reference_mode_data_without_a_name_is_rejected(client: FlaskClient) -> None:
    headers = ce_headers(ce_type="dev.knative.apiserver.ref.add")
    resp = client.post("/", headers=headers, data=json.dumps({"apiVersion": "v1",
                                                               "kind": "ConfigMap"}))
    assert resp.status_code == 400
    assert resp.get_json()["error"] == "Reference-mode data must name the object: missing name"


def test_time_that_is_not_a_timestamp_is_rejected(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(ce_time="yesterday"), data=b"{}")
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        "attribute 'time' is not an RFC 3339 timestamp: 'yesterday'")


def test_extension_with_an_invalid_name_is_rejected_naming_it(client: FlaskClient) -> None:
    resp = client.post("/", headers=ce_headers(ce_my_ext="1"), data=b"{}")
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error.startswith("invalid CloudEvent: ")
    assert "'my-ext' should only contain lowercase letters and numbers" in error


def test_malformed_event_is_counted_without_its_sender_chosen_type(client: FlaskClient) -> None:
    before = metric("eventop_events_total", type="", kind="", outcome="invalid")
    client.post("/", headers=ce_headers(ce_source=None, ce_type="attacker.chosen"), data=b"{}")
    assert metric("eventop_events_total", type="", kind="", outcome="invalid") == before + 1
    assert metric("eventop_events_total", type="attacker.chosen", kind="",
                  outcome="invalid") == 0


# -- 413 and 415 ---------------------------------------------------------------------------

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


@pytest.mark.parametrize(("content_type", "shown"), [
    ("application/json", "Content-Type 'application/json'"),
    ("text/plain", "Content-Type 'text/plain'"),
    (None, "no Content-Type"),
])
def test_request_without_ce_headers_or_structured_type_is_415(
        client: FlaskClient, content_type: str | None, shown: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    resp = client.post("/", headers=headers, data=b'{"a": 1}')
    assert resp.status_code == 415
    assert resp.get_json()["error"] == (
        f"not a CloudEvent: {shown} and no ce-* headers; send binary mode (ce-id, ce-source, "
        "ce-type, ce-specversion headers) or structured mode (Content-Type: "
        "application/cloudevents+json)")


def test_batched_cloudevents_are_415_saying_batches_are_unsupported(client: FlaskClient) -> None:
    batch = [{"specversion": "1.0", "id": "1", "source": "/s", "type": "test.any"}]
    resp = client.post("/", data=json.dumps(batch),
                       content_type="application/cloudevents-batch+json")
    assert resp.status_code == 415
    assert resp.get_json()["error"] == (
        "batched CloudEvents (application/cloudevents-batch+json) are not supported: send one "
        "event per request, in binary or structured mode")


def test_structured_mode_in_another_format_is_415(client: FlaskClient) -> None:
    resp = client.post("/", data=b"<event/>", content_type="application/cloudevents+xml")
    assert resp.status_code == 415
    assert resp.get_json()["error"] == (
        "unsupported CloudEvents format 'application/cloudevents+xml': only JSON "
        "(application/cloudevents+json) is supported in structured mode")


# -- handler failures ----------------------------------------------------------------------

def test_handler_exception_is_500_naming_event_and_handler_and_others_still_run(
        client: FlaskClient, recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    resp = post(client, binary(cloudevent("test.fail", {"a": 1}, id_="boom-1")))
    assert resp.status_code == 500
    body = resp.get_json()
    assert body["id"] == "boom-1" and body["outcome"] == "error"
    assert body["error"] == ("event boom-1: handler(s) failed: "
                             f"{__name__}.Recorder.__init__.<locals>.fails: "
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
        client: FlaskClient) -> None:
    resp = post(client, binary(cloudevent("test.unavailable", {}, id_="down-1")))
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["outcome"] == "unavailable"
    assert body["error"].startswith("event down-1: handler(s) failed: ")
    assert "api_down: Unavailable: Kubernetes API unreachable (test)" in body["error"]


def test_other_kubernetes_errors_are_500(client: FlaskClient) -> None:
    resp = post(client, binary(cloudevent("test.notfound", {}, id_="nf-1")))
    assert resp.status_code == 500
    assert "not_found: NotFound: 404 NotFound" in resp.get_json()["error"]


def test_no_kubernetes_configured_is_503_when_a_handler_needs_the_api(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    _no_kube_configured(monkeypatch, tmp_path)
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
        def dispatch(self, event: Event, kube: Any) -> list[Any]:
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


# -- probes, metrics, other routes ---------------------------------------------------------

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
        "tests.router.test_app.Recorder.__init__.<locals>.copy_rules wait(s) for the "
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


def test_readyz_is_503_when_no_kubernetes_api_is_configured(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    _no_kube_configured(monkeypatch, tmp_path)
    resp = create_app(registry=recorder.registry).test_client().get("/readyz")
    assert resp.status_code == 503
    assert "no Kubernetes API configured" in resp.get_json()["reason"]


def test_metrics_count_events_by_type_kind_outcome_and_time_handlers(
        client: FlaskClient) -> None:
    labels = {"type": "dev.knative.apiserver.resource.add", "kind": "ConfigMap",
              "outcome": "ok"}
    handler = f"{__name__}.Recorder.__init__.<locals>.configmaps"
    before = metric("eventop_events_total", **labels)
    before_h = metric("eventop_handler_duration_seconds_count", handler=handler)
    for i in range(3):
        post(client, binary(kube_event("add", configmap(uid=f"m{i}"))))
    text = client.get("/metrics").get_data(as_text=True)
    assert metric("eventop_events_total", **labels) == before + 3
    assert metric("eventop_handler_duration_seconds_count", handler=handler) == before_h + 3
    assert ('eventop_events_total{kind="ConfigMap",outcome="ok",'
            'type="dev.knative.apiserver.resource.add"}') in text
    assert f'eventop_handler_duration_seconds_bucket{{handler="{handler}",le="0.001"}}' in text
    assert "# TYPE eventop_kube_requests_total counter" in text


def test_unknown_path_and_wrong_method_answer_json(client: FlaskClient) -> None:
    resp = client.get("/nope")
    assert resp.status_code == 404 and resp.get_json()["error"].startswith("Not Found")
    resp = client.get("/")
    assert resp.status_code == 405
    assert resp.get_json()["error"].startswith("Method Not Allowed")


# -- logging -----------------------------------------------------------------------------

def test_one_structured_log_line_per_event_without_its_data(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    obj = configmap("db", "team-b", data={"password": "hunter2-secret"}, uid="L",
                    resource_version="9")
    post(client, binary(kube_event("update", obj)))
    lines = [r for r in caplog.records if r.name == "eventop.router"]
    assert len(lines) == 1
    fields = json.loads(JsonFormatter().format(lines[0]))
    assert fields["message"] == (
        f"update ConfigMap team-b/db: {__name__}.Recorder.__init__.<locals>.configmaps: "
        f"converged (200 in {fields['duration_ms']:g} ms)")
    assert fields["results"] == [{"handler": f"{__name__}.Recorder.__init__.<locals>.configmaps",
                                  "outcome": "ok", "detail": "converged"}]
    assert {k: fields[k] for k in ("id", "type", "kind", "namespace", "name", "handlers",
                                   "outcome", "status")} == {
        "id": "L/9/update", "type": "dev.knative.apiserver.resource.update",
        "kind": "ConfigMap", "namespace": "team-b", "name": "db",
        "handlers": [f"{__name__}.Recorder.__init__.<locals>.configmaps"],
        "outcome": "ok", "status": 200}
    assert isinstance(fields["duration_ms"], float) and fields["duration_ms"] >= 0
    assert all("hunter2-secret" not in JsonFormatter().format(r) for r in caplog.records)


def test_rejected_event_is_logged_with_the_reason(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    client.post("/", headers=ce_headers(ce_source=None, ce_id="bad-1"), data=b"{}")
    [line] = [r for r in caplog.records if r.name == "eventop.router"]
    assert line.levelno == logging.WARNING
    fields = json.loads(JsonFormatter().format(line))
    assert (fields["id"], fields["outcome"], fields["status"]) == ("bad-1", "invalid", 400)
    assert "'source' (header ce-source)" in fields["error"]


def test_json_formatter_writes_one_line_per_record() -> None:
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        import sys

        record = logging.LogRecord("eventop.router", logging.ERROR, __file__, 1, "failed %s",
                                   ("x",), sys.exc_info())
    record.fields = {"id": "e-1"}
    text = JsonFormatter().format(record)
    assert "\n" not in text
    parsed = json.loads(text)
    assert parsed["message"] == "failed x" and parsed["id"] == "e-1"
    assert "ValueError: line one\nline two" in parsed["traceback"]


# -- Kubernetes access per worker ------------------------------------------------------------

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
    monkeypatch.setattr("os.getpid", lambda: -1)  # as in a freshly forked worker
    assert provider.get() is not first and len(made) == 2


def _no_kube_configured(monkeypatch: pytest.MonkeyPatch, home: Any) -> None:
    for name in ("EVENTOP_KUBE_URL", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))


def test_line_handler_writes_whole_json_lines_to_its_descriptor(tmp_path: Any) -> None:
    from eventop.router.logs import LineHandler

    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        handler = LineHandler(fd)
        handler.setFormatter(JsonFormatter())
        logger = logging.getLogger("eventop.test.linehandler")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.warning("first")
            logger.warning("second %s", "é", extra={"fields": {"id": "x"}})
        finally:
            logger.removeHandler(handler)
    finally:
        os.close(fd)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(line["message"], line.get("id")) for line in lines] == [
        ("first", None), ("second é", "x")]


def test_logging_setup_leaves_configured_logging_alone_unless_forced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.router import logs

    logger = logging.getLogger("eventop")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    root_handler = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [root_handler])
    logs.configure()
    assert logger.handlers == [] and logger.propagate  # pytest's or the host's handlers win
    logs.configure(force=True)
    [ours] = logger.handlers
    assert isinstance(ours.formatter, JsonFormatter) and not logger.propagate
    logs.configure(force=True)
    assert logger.handlers == [ours]  # idempotent


def test_event_metric_series_are_bounded_whatever_types_a_sender_invents(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.router import metrics

    monkeypatch.setattr(metrics, "MAX_EVENT_SERIES", 2)
    monkeypatch.setattr(metrics, "_series", set())
    metrics.event_counter.cache_clear()
    try:
        for i in range(5):
            metrics.event_counter(f"com.example.invented.{i}", "Thing", "ignored").inc()
        text = metrics.render()[0].decode()
        assert 'type="com.example.invented.0"' in text
        assert 'type="com.example.invented.1"' in text
        assert 'type="com.example.invented.2"' not in text
        assert 'eventop_events_total{kind="other",outcome="ignored",type="other"} 3.0' in text
    finally:
        metrics.event_counter.cache_clear()
