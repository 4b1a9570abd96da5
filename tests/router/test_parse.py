"""What the router accepts as a CloudEvent and what it refuses (``router/parse.py``, through
the app): data in each mode and content type, 400 for a malformed event naming what is wrong,
415 for a request that is not a CloudEvent it reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.router.support import (
    Recorder,
    ce_headers,
)

# -- data in each mode -------------------------------------------------------------------------

def test_structured_mode_accepts_data_base64_json(client: FlaskClient,
                                                  recorder: Recorder) -> None:
    body = json.dumps({"specversion": "1.0", "id": "b64", "source": "/t", "type": "test.any",
                       "datacontenttype": "application/json",
                       "data_base64": "eyJhIjogMX0="}).encode()  # {"a": 1}
    resp = client.post("/", data=body, content_type="application/cloudevents+json")
    assert resp.status_code == 200
    assert recorder.seen[0][1].data == {"a": 1}



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


# -- malformed events: 400 ---------------------------------------------------------------------

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



@pytest.mark.parametrize("content_type", ["text/plain", "application/xml",
                                          "application/octet-stream"])
def test_a_kubernetes_event_whose_data_is_not_json_is_an_unsupported_content_type(
        client: FlaskClient, content_type: str) -> None:
    headers = ce_headers(ce_type="dev.knative.apiserver.resource.add", Content_Type=content_type)
    resp = client.post("/", headers=headers, data=b"<ConfigMap/>")
    assert resp.status_code == 415
    assert resp.get_json()["error"] == (
        "a dev.knative.apiserver.resource.add event carries its object as JSON "
        f"(application/json), not {content_type}")


def test_a_structured_kubernetes_event_saying_its_data_is_text_is_415(
        client: FlaskClient) -> None:
    body = {"specversion": "1.0", "id": "x", "source": "/t", "type":
            "dev.knative.apiserver.resource.add", "datacontenttype": "text/plain",
            "data": "apiVersion: v1"}
    resp = client.post("/", data=json.dumps(body),
                       headers={"Content-Type": "application/cloudevents+json"})
    assert resp.status_code == 415


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



@pytest.mark.parametrize(("mode", "extension", "value", "said"), [
    ("resource", "kind", "ConfigMap", "kind 'ConfigMap' in the extension, 'Secret' in the data"),
    ("resource", "apiversion", "apps/v1", "apiversion 'apps/v1' in the extension, 'v1' in the "
                                          "data"),
    ("resource", "name", "other", "name 'other' in the extension, 'cfg' in the data"),
    ("ref", "namespace", "prod", "namespace 'prod' in the extension, 'a' in the data"),
])
def test_an_event_whose_extensions_and_data_name_different_objects_is_rejected(
        client: FlaskClient, mode: str, extension: str, value: str, said: str) -> None:
    """The extensions are the routing contract and handlers act on the data: routed by one
    and acted on as the other, a forged or buggy event could reach a handler that never
    asked for that kind."""
    obj = {"apiVersion": "v1", "kind": "Secret" if extension == "kind" else "ConfigMap"}
    data = ({**obj, "metadata": {"name": "cfg", "namespace": "a"}} if mode == "resource"
            else {**obj, "name": "cfg", "namespace": "a"})
    headers = ce_headers(ce_type=f"dev.knative.apiserver.{mode}.update",
                         **{f"ce_{extension}": value})
    resp = client.post("/", headers=headers, data=json.dumps(data))
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        f"the event's extensions and its data name different objects: {said}")


def test_extensions_that_agree_with_the_data_or_are_absent_are_accepted(
        client: FlaskClient) -> None:
    data = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    for headers in (ce_headers(ce_type="dev.knative.apiserver.resource.add", ce_kind="Namespace",
                               ce_name="team-a", ce_apiversion="v1"),
                    ce_headers(ce_type="dev.knative.apiserver.resource.add")):
        resp = client.post("/", headers=headers, data=json.dumps(data))
        assert resp.status_code in (200, 202), resp.get_json()


@pytest.mark.parametrize(("mode", "data", "what"), [
    ("ref", {"apiVersion": "v1", "kind": "ConfigMap", "name": "cfg", "namespace": "x?y"},
     "namespace 'x?y'"),
    ("ref", {"apiVersion": "v1", "kind": "ConfigMap", "name": "..", "namespace": "a"},
     "name '..'"),
    ("resource", {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "a/status", "namespace": "a"}}, "name 'a/status'"),
])
def test_an_object_name_no_kubernetes_object_can_have_is_rejected_not_retried(
        client: FlaskClient, mode: str, data: dict[str, Any], what: str) -> None:
    # Answered 400 (final), not 503 (the sender would retry a request no API server answers)
    headers = ce_headers(ce_type=f"dev.knative.apiserver.{mode}.add")
    resp = client.post("/", headers=headers, data=json.dumps(data))
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith(f"no Kubernetes object can have the {what}")


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


# -- not a CloudEvent: 415 ---------------------------------------------------------------------

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
