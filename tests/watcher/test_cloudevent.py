"""The CloudEvent contract (README, "The event contract"), checked on recorded objects."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary
from cloudevents.core.formats.json import JSONFormat

from eventop.events import simple_event, to_cloudevent, to_http

REC = Path(__file__).resolve().parents[1] / "recordings"


def _first(path: str) -> dict:
    return json.loads((REC / path).read_text().splitlines()[0])["object"]


def test_namespaced_object_gets_knative_resource_attributes() -> None:
    obj = _first("copy-rules/api_v1_secrets.watch.jsonl")
    seen = datetime(2026, 11, 21, 7, 40, 58, tzinfo=UTC)
    ev = to_cloudevent("add", obj, "https://10.96.0.1:443", seen)
    assert ev.get_type() == "dev.knative.apiserver.resource.add"
    assert ev.get_id() == "cb43558f-b73c-418a-9fd1-6d08ce47a1f3/242/add"
    assert ev.get_subject() == "/apis/v1/namespaces/default/secrets/regcred"
    assert ev.get_source() == "https://10.96.0.1:443"
    assert ev.get_time() == seen
    assert ev.get_datacontenttype() == "application/json"
    assert ev.get_data() == obj
    exts = {k: ev.get_extension(k) for k in ("kind", "name", "namespace", "apiversion")}
    assert exts == {"kind": "Secret", "name": "regcred", "namespace": "default",
                    "apiversion": "v1"}


def test_cluster_scoped_custom_resource_has_no_namespace_segment_or_extension() -> None:
    obj = _first("copy-rules/apis_eventop.dev_v1_copyrules.watch.jsonl")
    ev = to_cloudevent("delete", obj, "s")
    assert ev.get_subject() == "/apis/eventop.dev/v1/copyrules/main-rule"
    assert ev.get_type().endswith(".delete")
    assert ev.get_extension("namespace") is None


def test_unknown_kind_uses_the_plural_given_by_the_watcher() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Moose",
           "metadata": {"name": "m", "namespace": "zoo", "uid": "u", "resourceVersion": "9"}}
    ev = to_cloudevent("update", obj, "s", plural="meese")
    assert ev.get_subject() == "/apis/example.com/v1/namespaces/zoo/meese/m"


def test_binary_http_round_trips_through_the_sdk() -> None:
    obj = _first("mirrors-and-rates/apis_eventop.dev_v1_registrymirrors.watch.jsonl")
    headers, body = to_http(to_cloudevent("update", obj, "s", "2026-11-21T07:41:00Z"))
    assert headers["ce-id"].endswith("/update")
    assert headers["content-type"] == "application/json"
    back = from_binary(HTTPMessage(headers, body), JSONFormat())
    assert back.get_data() == obj
    assert back.get_id() == headers["ce-id"]


def test_same_change_always_gets_the_same_id() -> None:
    obj = _first("copy-rules/api_v1_configmaps.watch.jsonl")
    assert to_cloudevent("add", obj, "a").get_id() == to_cloudevent("add", obj, "b").get_id()


def test_refuses_unknown_change_and_list_items_without_kind() -> None:
    obj = _first("copy-rules/api_v1_configmaps.watch.jsonl")
    with pytest.raises(ValueError, match="change"):
        to_cloudevent("ADDED", obj, "s")
    with pytest.raises(ValueError, match="apiVersion and kind"):
        to_cloudevent("add", {"metadata": obj["metadata"]}, "s")


def test_simple_event_carries_json_data_only_when_given() -> None:
    headers, body = to_http(simple_event("dev.eventop.exchangerates.refresh", "cron"))
    assert body == b"" and "content-type" not in headers
    headers, body = to_http(simple_event("t", "cron", {"a": 1}, "fixed"))
    assert json.loads(body) == {"a": 1} and headers["ce-id"] == "fixed"
