"""Hostile and broken input to the router: never a 5xx, never a crash, bounded memory.

The router runs with the real handlers against a local API server, so a malformed
Kubernetes object travels as far as it can. hypothesis generates the requests: random
headers and encodings, random and deeply nested JSON, wrong specversions, objects of the
wrong shape. A bad request is the sender's problem (4xx, or 2xx when it names an object
that does not exist: a forged event can at most cause a reconcile); a 5xx would make a
sender retry it forever.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventop.kube import Kube
from eventop.router.app import create_app
from tests.support.apiserver import local_kube_server

LIMIT = 256 * 1024
ACCEPTABLE = {200, 202, 400, 401, 413, 415}
KUBE_TYPES = [f"dev.knative.apiserver.{m}.{c}" for m in ("resource", "ref")
              for c in ("add", "update", "delete")]
KINDS = [("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Namespace"),
         ("eventop.dev/v1", "CopyRule"), ("eventop.dev/v1", "ExchangeRate"),
         ("eventop.dev/v1", "RegistryMirror"), ("apps/v1", "StatefulSet")]
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def client() -> Iterator[FlaskClient]:
    previous = os.environ.get("EVENTOP_MAX_BODY_BYTES")
    os.environ["EVENTOP_MAX_BODY_BYTES"] = str(LIMIT)
    os.environ.setdefault("RATES_API_URL", "http://127.0.0.1:9")  # never reached by a test
    try:
        with local_kube_server() as server:
            app = create_app(kube=Kube.connect(url=server.url))
            try:
                yield app.test_client()
            finally:
                # Its cache's watches would outlive the server, retrying and logging into
                # whatever test runs next.
                app.extensions["eventop"]["engine"].stop()
    finally:
        if previous is None:
            os.environ.pop("EVENTOP_MAX_BODY_BYTES", None)
        else:
            os.environ["EVENTOP_MAX_BODY_BYTES"] = previous


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=20)

header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40)


def wrong_shapes() -> st.SearchStrategy[Any]:
    """Kubernetes objects with fields of the wrong type or in the wrong place."""
    kind = st.sampled_from(KINDS)
    meta = st.fixed_dictionaries({"name": st.text(min_size=1, max_size=30)}, optional={
        "namespace": json_values, "labels": json_values, "uid": json_values,
        "ownerReferences": json_values | st.lists(st.dictionaries(
            st.sampled_from(["apiVersion", "kind", "name", "uid", "controller"]),
            json_values | st.sampled_from(["eventop.dev/v1", "RegistryMirror", "CopyRule",
                                           "apps/v1", "StatefulSet"])), max_size=3),
        "resourceVersion": json_values,
        "deletionTimestamp": json_values, "annotations": json_values})
    return st.builds(
        lambda k, m, extra: {"apiVersion": k[0], "kind": k[1], "metadata": m, **extra},
        kind, meta, st.dictionaries(st.sampled_from(["spec", "data", "status", "type",
                                                     "stringData", "binaryData"]),
                                    json_values, max_size=3))


def post(client: FlaskClient, headers: dict[str, str], body: bytes) -> int:
    resp = client.post("/", headers=headers, data=body)
    return resp.status_code


@FUZZ
@given(headers=st.dictionaries(st.sampled_from(
    ["ce-id", "ce-source", "ce-type", "ce-specversion", "ce-time", "ce-subject",
     "ce-kind", "ce-name", "ce-namespace", "ce-apiversion", "ce-datacontenttype",
     "content-type", "content-encoding", "ce-" + "x" * 50, "authorization"]), header_text,
    max_size=10), body=st.binary(max_size=512))
def test_random_headers_and_bytes_never_get_a_5xx(client: FlaskClient,
                                                  headers: dict[str, str], body: bytes) -> None:
    assert post(client, headers, body) in ACCEPTABLE


@FUZZ
@given(data=json_values, specversion=st.sampled_from(["1.0", "0.3", "2.0", "", "1"]),
       mode=st.sampled_from(["binary", "structured"]),
       type_=st.sampled_from([*KUBE_TYPES, "dev.eventop.exchangerates.refresh", "x.y"]))
def test_random_json_and_wrong_specversions_never_get_a_5xx(
        client: FlaskClient, data: Any, specversion: str, mode: str, type_: str) -> None:
    status = post(client, *_event(type_, data, specversion, mode))
    assert status in ACCEPTABLE
    if specversion != "1.0":
        assert status == 400


@FUZZ
@given(obj=wrong_shapes(), type_=st.sampled_from(KUBE_TYPES),
       mode=st.sampled_from(["binary", "structured"]))
def test_kubernetes_objects_of_the_wrong_shape_never_get_a_5xx(
        client: FlaskClient, obj: dict[str, Any], type_: str, mode: str) -> None:
    assert post(client, *_event(type_, obj, "1.0", mode)) in ACCEPTABLE


@pytest.mark.parametrize("depth", [50, 5_000, 100_000])
@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_deeply_nested_json_is_refused_or_handled_never_a_5xx(client: FlaskClient,
                                                               depth: int, mode: str) -> None:
    nested = "[" * depth + "]" * depth
    if mode == "binary":
        headers = _headers("dev.knative.apiserver.resource.add", "1.0")
        body = nested.encode()
    else:
        headers = {"content-type": "application/cloudevents+json"}
        body = ('{"specversion": "1.0", "id": "deep", "source": "/fuzz", "type": "x.y", '
                f'"data": {nested}}}').encode()
    assert post(client, headers, body) in {400, 202}


@pytest.mark.parametrize("chunked", [False, True])
def test_a_huge_body_is_refused_with_memory_bounded_by_the_limit(client: FlaskClient,
                                                                  chunked: bool) -> None:
    body = b'{"a": "' + b"x" * (20 * LIMIT) + b'"}'
    headers = _headers("dev.knative.apiserver.resource.add", "1.0")
    tracemalloc.start()
    try:
        if chunked:  # no Content-Length: the router must stop reading at the limit
            resp = client.post("/", headers=headers, input_stream=_Stream(body),
                               environ_overrides={"wsgi.input_terminated": True})
        else:
            resp = client.post("/", headers={**headers, "Content-Length": str(len(body))},
                               input_stream=_Stream(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 413
    assert peak < len(body) // 4 + 4 * LIMIT  # it never held the whole body


class _Stream:
    """A request body read in pieces, as a chunked upload arrives."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = len(self.data) - self.pos
        chunk = self.data[self.pos:self.pos + size]
        self.pos += len(chunk)
        return chunk

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else len(self.data) if whence == 2 else self.pos + pos
        return self.pos


def _headers(type_: str, specversion: str) -> dict[str, str]:
    return {"ce-id": "fuzz-1", "ce-source": "/fuzz", "ce-type": type_,
            "ce-specversion": specversion, "content-type": "application/json"}


def _event(type_: str, data: Any, specversion: str, mode: str) -> tuple[dict[str, str], bytes]:
    if mode == "binary":
        return _headers(type_, specversion), json.dumps(data).encode()
    doc = {"specversion": specversion, "id": "fuzz-1", "source": "/fuzz", "type": type_,
           "datacontenttype": "application/json", "data": data}
    return {"content-type": "application/cloudevents+json"}, json.dumps(doc).encode()


def test_metadata_of_a_shape_no_api_server_sends_is_a_400_naming_the_field(
        client: FlaskClient) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "mirror-hub", "namespace": "default", "ownerReferences": True}}
    resp = client.post("/", headers=_headers("dev.knative.apiserver.resource.update", "1.0"),
                       data=json.dumps(obj))
    assert resp.status_code == 400
    assert "metadata.ownerReferences must be a list" in resp.get_json()["error"]


@pytest.mark.parametrize("type_", ["dev.knative.apiserver.ref.add",
                                   "dev.knative.apiserver.resource.add"])
def test_an_event_naming_a_namespaced_object_without_a_namespace_is_a_400_not_a_deletion(
        client: FlaskClient, type_: str) -> None:
    """Taken as it is, the ExchangeRate would be looked up and found gone ("its owned
    children go with it"), an answer about an object the sender never named."""
    data = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "name": "x"}
    if type_.endswith("resource.add"):
        data = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                "metadata": {"name": "x", "uid": "u-1", "resourceVersion": "1"}}
    resp = client.post("/", headers=_headers(type_, "1.0"), data=json.dumps(data))
    assert resp.status_code == 400, resp.get_json()
    assert ("ExchangeRate 'x' without a namespace, but ExchangeRate is namespaced"
            in resp.get_json()["error"])


def test_an_event_answered_400_runs_no_on_function() -> None:
    """The 400 says the sender's event names no object an API server could send: an ``@on``
    function acting on it first would have acted on that same impossible object."""
    from eventop import handlers
    from eventop.handlers import Registry

    seen: list[str] = []
    mine = Registry()

    @mine.on("dev.knative.apiserver.*", api_version="eventop.dev/v1", kind="ExchangeRate")
    def audit(event: Any, kube: Any) -> None:
        seen.append(event.id)

    registry = handlers.load(extra="", builtin="exchange_rates")
    registry.include(mine)
    os.environ.setdefault("RATES_API_URL", "http://127.0.0.1:9")
    with local_kube_server() as server:
        app = create_app(registry=registry, kube=Kube.connect(url=server.url))
        try:
            client = app.test_client()
            obj = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                   "metadata": {"name": "x", "uid": "u-1", "resourceVersion": "1"}}
            bad = client.post("/", headers=_headers("dev.knative.apiserver.resource.add",
                                                     "1.0"), data=json.dumps(obj))
            obj["metadata"]["namespace"] = "default"
            good = client.post("/", headers={**_headers("dev.knative.apiserver.resource.add",
                                                          "1.0"), "ce-id": "fine-1"},
                               data=json.dumps(obj))
        finally:
            app.extensions["eventop"]["engine"].stop()
    assert bad.status_code == 400, bad.get_json()
    assert good.status_code == 200, good.get_json()
    assert seen == ["fine-1"]
