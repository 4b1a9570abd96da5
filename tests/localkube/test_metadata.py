"""PartialObjectMetadata(List) for get, list and watch, compared with the recorded v1.24 server
(``tests/recordings/kubectl/metadata/``): what a metadata-only informer receives."""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from eventop.localkube import LocalKube
from tests.localkube.support import cm, recording

POM = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
POML = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
CMS = "/api/v1/namespaces/default/configmaps"


def get(lk: LocalKube, path: str, accept: str, **params: str) -> tuple[int, Any]:
    resp = requests.get(lk.url + path, headers={"Accept": accept}, params=params, timeout=10)
    return resp.status_code, resp.json()


def ordered_like(mine: dict[str, Any], real: dict[str, Any]) -> bool:
    """Every key of ``mine`` is one the real server writes, in the real server's order."""
    order = list(real)
    return all(k in order for k in mine) and \
        [order.index(k) for k in mine] == sorted(order.index(k) for k in mine)


def test_list_as_metadata_has_the_recorded_shape_and_no_object_bodies(lk: LocalKube) -> None:
    lk.put(cm("settings", data={"a": "1"}, labels={"app": "web"}))
    status, body = get(lk, CMS, POML)
    real = recording("kubectl/metadata/configmaps-list.json")["body"]
    assert status == 200
    assert [i["metadata"]["name"] for i in body["items"]] == ["kube-root-ca.crt", "settings"]
    assert all(set(i) == {"kind", "apiVersion", "metadata"} for i in body["items"])
    assert body["items"][1]["metadata"]["labels"] == {"app": "web"}
    assert list(body) == list(real) and body["kind"] == real["kind"]
    real_item = real["items"][1]  # `settings`, applied by kubectl: it has an annotation more
    assert list(body["items"][1]) == list(real_item)
    assert ordered_like(body["items"][1]["metadata"], real_item["metadata"])
    assert list(body["items"][1]["metadata"]["managedFields"][0]) == \
        list(real_item["metadata"]["managedFields"][0])


def test_metadata_list_pages_like_the_recording(lk: LocalKube) -> None:
    lk.put(cm("settings"))
    status, body = get(lk, CMS, POML, limit="1")
    real = recording("kubectl/metadata/configmaps-list-limit.json")["body"]
    assert status == 200 and len(body["items"]) == 1
    assert list(body["metadata"]) == list(real["metadata"])  # resourceVersion, continue, count
    status, rest = get(lk, CMS, POML, limit="1", **{"continue": body["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in rest["items"]] == ["settings"]


def test_an_empty_metadata_list_has_null_items_as_recorded(lk: LocalKube) -> None:
    status, body = get(lk, "/apis/coordination.k8s.io/v1/namespaces/default/leases", POML)
    real = recording("kubectl/metadata/leases-list-empty.json")["body"]
    assert status == 200
    assert {**body, "metadata": {}} == {**real, "metadata": {}}
    assert body["items"] is None


def test_custom_resource_metadata_is_typed_object_meta_not_sorted_keys(lk: LocalKube) -> None:
    lk.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
            "metadata": {"name": "kubectl-rec", "annotations": {"note": "x"}},
            "spec": {"ruleType": "configmap", "namespaces": ["default"]}})
    status, body = get(lk, "/apis/eventop.dev/v1/copyrules/kubectl-rec", POM)
    real = recording("kubectl/metadata/copyrule-get.json")["body"]
    assert status == 200
    assert list(body) == list(real)
    assert ordered_like(body["metadata"], real["metadata"])
    assert list(body["metadata"])[:2] == ["name", "uid"]


def test_get_as_metadata_matches_the_recorded_shape(lk: LocalKube) -> None:
    lk.put(cm("settings", labels={"app": "web"}))
    status, body = get(lk, f"{CMS}/settings", POM)
    real = recording("kubectl/metadata/configmap-get.json")["body"]
    assert status == 200
    assert list(body) == list(real)
    assert ordered_like(body["metadata"], real["metadata"])
    assert body["metadata"]["labels"] == {"app": "web"}


def test_asking_a_list_for_an_object_and_the_reverse_are_the_recorded_406s(
        lk: LocalKube) -> None:
    lk.put(cm("settings"))
    cases = [(f"{CMS}/settings", POML, "406-object-as-list.json"),
             (CMS, POM, "406-list-as-object.json"),
             ("/apis/eventop.dev/v1/copyrules", POM, "406-custom-list-as-object.json"),
             (CMS, "application/json;as=Foo;v=v1;g=meta.k8s.io", "406-unknown-as.json"),
             (CMS, "text/html", "406-text-html.json")]
    for path, accept, name in cases:
        real = recording(f"kubectl/metadata/{name}")
        assert get(lk, path, accept) == (real["code"], real["body"]), name


def test_protobuf_first_accept_falls_back_to_json_like_clients_expect(lk: LocalKube) -> None:
    accept = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;"
              f"v=v1,{POML}")
    status, body = get(lk, CMS, accept)
    assert status == 200 and body["kind"] == "PartialObjectMetadataList"


def watch(lk: LocalKube, path: str, accept: str, **params: str) -> list[dict[str, Any]]:
    with requests.get(lk.url + path, headers={"Accept": accept}, stream=True, timeout=10,
                      params={"watch": "1", **params}) as resp:
        assert resp.status_code == 200
        return [json.loads(line) for line in resp.iter_lines() if line]


def test_metadata_watch_sends_partial_objects_and_recorded_bookmarks(lk: LocalKube) -> None:
    rv = str(lk.resource_version)
    timer = threading.Timer(0.3, lambda: lk.put(cm("watched", data={"k": "v"})))
    timer.start()
    events = watch(lk, CMS, POM, resourceVersion=rv, allowWatchBookmarks="true",
                   timeoutSeconds="1")
    timer.join()
    real = recording("kubectl/metadata/configmaps-watch.json")
    added = [e for e in events if e["type"] == "ADDED"]
    assert [e["object"]["metadata"]["name"] for e in added] == ["watched"]
    assert list(added[0]["object"]) == list(real[0]["object"])
    assert ordered_like(added[0]["object"]["metadata"], real[0]["object"]["metadata"])
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, "no bookmark within a second (bookmark_interval is 0.1 s)"
    recorded = next(e for e in real if e["type"] == "BOOKMARK")
    assert {**bookmarks[-1]["object"], "metadata": {}} == {**recorded["object"], "metadata": {}}
    assert list(bookmarks[-1]["object"]["metadata"].items())[1] == ("creationTimestamp", None)


def test_metadata_watch_of_custom_resources_and_initial_state(lk: LocalKube) -> None:
    lk.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
            "metadata": {"name": "usd", "namespace": "default"}, "spec": {"currency": "USD"}})
    events = watch(lk, "/apis/eventop.dev/v1/namespaces/default/exchangerates", POM,
                   timeoutSeconds="1")
    assert [(e["type"], e["object"]["kind"], e["object"]["metadata"]["name"])
            for e in events] == [("ADDED", "PartialObjectMetadata", "usd")]
    assert "spec" not in events[0]["object"]


def test_a_watch_asked_as_a_metadata_list_ends_at_its_first_event_as_recorded(
        lk: LocalKube) -> None:
    # The real server cannot encode an event as a list: it ends the stream, sending nothing.
    assert recording("kubectl/metadata/configmaps-watch-as-list.json") == []
    assert watch(lk, CMS, POML, timeoutSeconds="5") == []
