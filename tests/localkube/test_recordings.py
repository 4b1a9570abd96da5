"""localkube answers exactly like the recorded v1.24 kube-apiserver (tests/recordings/).

Error bodies are compared whole, lists and bookmarks by shape and bytes, so the fake cannot
drift from the real server unnoticed (the recorded scenarios' watch streams: test_replays.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from eventop.localkube import LocalKube
from tests.localkube.support import NS_PATH, REPO, Http, cm, recording, shape


def test_create_of_an_existing_configmap_is_the_recorded_409(http: Http) -> None:
    assert http.call("POST", "/api/v1/namespaces/default/configmaps", cm("dup"))[0] == 201
    status, body = http.call("POST", "/api/v1/namespaces/default/configmaps", cm("dup"))
    assert (status, body) == (409, recording("errors/create-409-already-exists.json"))


def test_get_of_a_missing_configmap_is_the_recorded_404(http: Http) -> None:
    status, body = http.call("GET", "/api/v1/namespaces/default/configmaps/nope")
    assert (status, body) == (404, recording("errors/get-404-not-found.json"))


def test_apply_into_a_missing_namespace_is_the_recorded_404(http: Http) -> None:
    status, body = http.call(
        "PATCH", "/api/v1/namespaces/gone-ns/configmaps/x", cm("x", "gone-ns"),
        content_type="application/apply-patch+yaml", params={"fieldManager": "eventop"})
    assert (status, body) == (404, recording("errors/apply-404-namespace-missing.json"))


def test_create_in_a_terminating_namespace_is_the_recorded_403(http: Http) -> None:
    http.call("POST", NS_PATH, {"metadata": {"name": "doomed"}})
    held = cm("held", "doomed")
    held["metadata"]["finalizers"] = ["example.com/hold"]  # keeps the namespace Terminating
    http.call("POST", "/api/v1/namespaces/doomed/configmaps", held)
    assert http.call("DELETE", f"{NS_PATH}/doomed")[0] == 200
    status, body = http.call("POST", "/api/v1/namespaces/doomed/configmaps", cm("x", "doomed"))
    assert (status, body) == (403, recording("errors/create-403-namespace-terminating.json"))


def test_custom_resource_outside_its_enum_is_the_recorded_422(http: Http) -> None:
    bad = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
           "metadata": {"name": "bad", "namespace": "default"}, "spec": {"currency": "EUR"}}
    status, body = http.call("POST", "/apis/eventop.dev/v1/namespaces/default/exchangerates",
                             bad)
    assert (status, body) == (422, recording("errors/create-422-invalid-custom-resource.json"))


def test_statefulset_whose_selector_misses_its_template_is_the_recorded_422(
        http: Http) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "bad", "namespace": "default"},
           "spec": {"serviceName": "bad", "selector": {"matchLabels": {"app": "a"}},
                    "template": {"metadata": {"labels": {"app": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    status, body = http.call("POST", "/apis/apps/v1/namespaces/default/statefulsets", sts)
    assert (status, body) == (422, recording("errors/create-422-invalid-statefulset.json"))


def _without_times(obj: dict[str, Any]) -> dict[str, Any]:
    meta = dict(obj["metadata"])
    meta["managedFields"] = [{k: v for k, v in e.items() if k != "time"}
                             for e in meta.get("managedFields", [])]
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key)
    return {**obj, "metadata": meta}


def test_apply_conflict_and_forced_apply_are_the_recorded_409_and_200(http: Http) -> None:
    http.call("POST", "/api/v1/namespaces/default/configmaps", cm("dup", data={"a": "1"}),
              params={"fieldManager": "curl"})
    path = "/api/v1/namespaces/default/configmaps/dup"
    change = cm("dup", data={"a": "2"})
    status, body = http.call("PATCH", path, change, content_type="application/apply-patch+yaml",
                             params={"fieldManager": "eventop"})
    assert (status, body) == (409, recording("errors/apply-409-conflict.json"))
    status, body = http.call("PATCH", path, change, content_type="application/apply-patch+yaml",
                             params={"fieldManager": "eventop", "force": "true"})
    assert status == 200
    assert _without_times(body) == _without_times(recording("errors/apply-200-forced.json"))


def test_resizing_an_unbound_claim_is_the_recorded_422() -> None:
    with LocalKube(crd_dir=REPO / "crds", bind_pvcs=False) as server:
        http = Http(server.url)
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": "cache", "namespace": "default"},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": "1Gi"}}}}
        path = "/api/v1/namespaces/default/persistentvolumeclaims/cache"
        apply = {"content_type": "application/apply-patch+yaml",
                 "params": {"fieldManager": "eventop"}}
        assert http.call("PATCH", path, claim, **apply)[0] == 201  # type: ignore[arg-type]
        claim["spec"]["resources"]["requests"]["storage"] = "2Gi"
        status, body = http.call("PATCH", path, claim, **apply)  # type: ignore[arg-type]
        http.close()
    assert (status, body) == (422, recording("errors/apply-422-pvc-resize-unbound.json"))


def test_watch_from_a_compacted_version_is_the_recorded_410(lk: LocalKube, http: Http) -> None:
    lk.put(cm("a"))
    lk.compact()
    events = http.watch("/api/v1/configmaps", resourceVersion=1)
    [expected] = recording("watch-expired/api_v1_configmaps.watch-from-rv1.jsonl")
    expected["object"]["message"] = re.sub(r"\(\d+\)", f"({lk.resource_version})",
                                           expected["object"]["message"])
    assert events == [expected]


@pytest.mark.parametrize(("path", "recorded"), [
    ("/api/v1/configmaps", "copy-rules/api_v1_configmaps.watch.jsonl"),
    ("/api/v1/secrets", "copy-rules/api_v1_secrets.watch.jsonl"),
    ("/api/v1/namespaces", "copy-rules/api_v1_namespaces.watch.jsonl"),
    ("/apis/eventop.dev/v1/copyrules", "copy-rules/apis_eventop.dev_v1_copyrules.watch.jsonl"),
    ("/apis/eventop.dev/v1/exchangerates",
     "mirrors-and-rates/apis_eventop.dev_v1_exchangerates.watch.jsonl"),
    ("/apis/eventop.dev/v1/registrymirrors",
     "mirrors-and-rates/apis_eventop.dev_v1_registrymirrors.watch.jsonl"),
])
def test_bookmark_lines_are_byte_for_byte_the_recorded_ones(
        lk: LocalKube, http: Http, path: str, recorded: str) -> None:
    rv = lk.resource_version
    lines = http.watch_lines(path, resourceVersion=rv, allowWatchBookmarks="true",
                             timeoutSeconds=0.35)
    expected = next(line for line in (RECORDING_LINES(recorded)) if b'"BOOKMARK"' in line)
    expected = re.sub(rb'"resourceVersion":"\d+"', f'"resourceVersion":"{rv}"'.encode(),
                      expected)
    assert lines and set(lines) == {expected}


def RECORDING_LINES(name: str) -> list[bytes]:
    return [line for line in (REPO / "tests/recordings" / name).read_bytes().splitlines()
            if line.strip()]


def test_lists_are_shaped_like_the_recorded_lists(http: Http) -> None:
    status, core = http.call("GET", "/api/v1/namespaces")
    recorded = recording("copy-rules/api_v1_namespaces.list.json")
    assert status == 200
    assert list(core) == list(recorded)
    assert list(core["metadata"]) == ["resourceVersion"]
    assert "kind" not in core["items"][0] and "apiVersion" not in core["items"][0]
    assert shape(core["items"][0]) == shape(recorded["items"][0])
    status, custom = http.call("GET", "/apis/eventop.dev/v1/exchangerates")
    recorded = recording("mirrors-and-rates/apis_eventop.dev_v1_exchangerates.list.json")
    assert list(custom) == list(recorded)
    assert custom["metadata"]["continue"] == "" and custom["items"] == []


def test_a_fresh_server_lists_the_namespaces_and_root_ca_configmaps_of_a_fresh_cluster(
        http: Http) -> None:
    names = [i["metadata"]["name"] for i in http.call("GET", NS_PATH)[1]["items"]]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    cms = http.call("GET", "/api/v1/configmaps")[1]["items"]
    recorded = recording("copy-rules/api_v1_configmaps.list.json")["items"]
    root = next(i for i in recorded if i["metadata"]["namespace"] == "default")
    assert {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in cms} == {
        (ns, "kube-root-ca.crt") for ns in names}
    ours = next(i for i in cms if i["metadata"]["namespace"] == "default")
    assert ours["metadata"]["annotations"] == root["metadata"]["annotations"]
    assert shape(ours) == shape(root)


def test_rbac_names_are_path_segments_refused_only_as_the_recorded_422(http: Http) -> None:
    """The real server keeps its own RoleBindings as ``system:controller:...``: a recording
    of them must replay; only '.', '..' and names with '/' or '%' are refused."""
    path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    for name in ("system:controller:bootstrap-signer", "Upper_Case"):
        assert http.call("POST", path, {"metadata": {"name": name}, "roleRef": ref})[0] == 201
    status, body = http.call("POST", path, {"metadata": {"name": ".."}, "roleRef": ref})
    assert (status, body) == (422, recording("errors/create-422-rbac-name.json"))
