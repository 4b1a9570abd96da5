"""``as=Table`` (kubectl get's columns) compared with the recorded v1.24 server
(``tests/recordings/kubectl/tables/``), for the objects ``record_kubectl.py`` created there."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
import requests
import yaml

from eventop.localkube import LocalKube
from eventop.localkube.tables import human_duration
from tests.localkube.record_kubectl import COLLECTIONS, NS, OBJECTS
from tests.localkube.support import recording

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
AGE = re.compile(r"^\d+[smhdy]")
# Cells a real cluster's controllers fill in (status, events, IPs) or that depend on which
# objects exist there (ServiceAccount "default", the CRD list, the namespace list).
DIFFERENT = {"deployments": {1, 2, 3}, "statefulsets": {1}, "pods": set(range(9)),
             "events": set(range(10)), "services": {2},
             "persistentvolumeclaims": {1, 2, 3, 4},  # localkube binds claims at once
             "namespaces": set(range(3)), "customresourcedefinitions": {1},
             "serviceaccounts": set(range(3)), "copyrules": set(range(7))}


@pytest.fixture
def populated(lk: LocalKube) -> LocalKube:
    for doc in yaml.safe_load_all(OBJECTS):
        lk.put(doc)
    return lk


def get(lk: LocalKube, path: str, accept: str = TABLE, **params: str) -> tuple[int, Any]:
    resp = requests.get(lk.url + path, headers={"Accept": accept}, params=params, timeout=10)
    return resp.status_code, resp.json()


def cells_alike(mine: list[Any], real: list[Any], skip: set[int]) -> bool:
    for i, (a, b) in enumerate(zip(mine, real, strict=True)):
        if i in skip:
            continue
        if isinstance(b, str) and AGE.match(b) and isinstance(a, str) and AGE.match(a):
            continue  # an age: the recording is older than this test's objects
        if a != b:
            return False
    return True


@pytest.mark.parametrize("stem,path", COLLECTIONS, ids=[c[0] for c in COLLECTIONS])
def test_table_columns_and_cells_match_the_real_server(populated: LocalKube, stem: str,
                                                       path: str) -> None:
    real = recording(f"kubectl/tables/{stem}.json")["body"]
    status, body = get(populated, path)
    assert status == 200, body
    assert (body["kind"], body["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert body["columnDefinitions"] == real["columnDefinitions"]
    real_rows = {r["object"]["metadata"]["name"]: r for r in real["rows"]}
    mine = {r["object"]["metadata"]["name"]: r for r in body["rows"]}
    shared = set(real_rows) & set(mine)
    assert shared, f"no row in common: {sorted(mine)} vs {sorted(real_rows)}"
    for name in shared:
        assert cells_alike(mine[name]["cells"], real_rows[name]["cells"],
                           DIFFERENT.get(stem, set())), \
            (name, mine[name]["cells"], real_rows[name]["cells"])
        assert mine[name]["object"]["kind"] == "PartialObjectMetadata"


def test_printers_of_workloads_read_their_status_like_the_real_ones(lk: LocalKube) -> None:
    lk.put({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                     "matchExpressions": [{"key": "tier", "operator": "In",
                                           "values": ["a", "b"]}]},
                     "template": {"metadata": {"labels": {"app": "web", "tier": "a"}},
                                  "spec": {"containers": [{"name": "c", "image": "i:1"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}})
    _, body = get(lk, "/apis/apps/v1/namespaces/default/deployments")
    cells = body["rows"][0]["cells"]
    assert cells[:4] == ["web", "2/3", 3, 2]
    assert cells[5:] == ["c", "i:1", "app=web,tier in (a,b)"]


def test_service_ports_and_external_ips_print_like_kubectl_shows_them(lk: LocalKube) -> None:
    lk.put({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "selector": {"b": "2", "a": "1"},
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}})
    _, body = get(lk, "/api/v1/namespaces/default/services/lb")
    cells = body["rows"][0]["cells"]
    assert cells[1] == "LoadBalancer" and cells[3] == "<pending>"
    assert cells[4] == "80:30080/TCP" and cells[6] == "a=1,b=2"


def test_a_single_get_is_a_one_row_table_with_the_objects_version(populated: LocalKube) -> None:
    real = recording("kubectl/tables/configmap-get.json")["body"]
    status, body = get(populated, f"/api/v1/namespaces/{NS}/configmaps/settings")
    assert status == 200 and len(body["rows"]) == 1
    stored = populated.get("v1", "ConfigMap", "settings", NS)
    assert stored is not None
    assert body["metadata"] == {"resourceVersion": stored["metadata"]["resourceVersion"]}
    assert list(body) == list(real) and body["rows"][0]["cells"][:2] == real["rows"][0][
        "cells"][:2]


@pytest.mark.parametrize("include,recorded", [("Object", "configmaps-include-object.json"),
                                              ("None", "configmaps-include-none.json")])
def test_include_object_sends_the_whole_object_or_none(populated: LocalKube, include: str,
                                                       recorded: str) -> None:
    real = recording(f"kubectl/tables/{recorded}")["body"]
    _, body = get(populated, f"/api/v1/namespaces/{NS}/configmaps", includeObject=include)
    row = next(r for r in body["rows"] if r["cells"][0] == "settings")
    real_row = next(r for r in real["rows"] if r["cells"][0] == "settings")
    if real_row["object"] is None:
        assert row["object"] is None
    else:
        assert row["object"]["kind"] == real_row["object"]["kind"] == "ConfigMap"
        assert row["object"]["data"] == real_row["object"]["data"]


def test_a_v1beta1_table_is_answered_in_v1beta1(populated: LocalKube) -> None:
    real = recording("kubectl/tables/configmaps-v1beta1.json")["body"]
    _, body = get(populated, f"/api/v1/namespaces/{NS}/configmaps",
                  "application/json;as=Table;v=v1beta1;g=meta.k8s.io")
    assert body["apiVersion"] == real["apiVersion"] == "meta.k8s.io/v1beta1"
    assert body["rows"][0]["object"]["apiVersion"] == real["rows"][0]["object"]["apiVersion"]


def test_table_watch_sends_column_definitions_only_in_the_first_event(
        populated: LocalKube) -> None:
    real = recording("kubectl/tables/configmaps-watch.json")
    path = f"/api/v1/namespaces/{NS}/configmaps"
    timer = threading.Timer(0.3, lambda: populated.put(
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "watched", "namespace": NS}, "data": {"k": "v"}}))
    timer.start()
    with requests.get(populated.url + path, headers={"Accept": TABLE}, stream=True, timeout=10,
                      params={"watch": "1", "timeoutSeconds": "1"}) as resp:
        events = [json.loads(line) for line in resp.iter_lines() if line]
    timer.join()
    assert [e["object"]["columnDefinitions"] is not None for e in events] == \
        [e["object"]["columnDefinitions"] is not None for e in real]
    assert events[-1]["object"]["rows"][0]["cells"][:2] == ["watched", 1]
    assert list(events[-1]["object"]) == list(real[-1]["object"])


def test_custom_resource_cells_follow_the_crd_printer_columns(lk: LocalKube) -> None:
    lk.put({"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": "m", "namespace": "default"},
            "spec": {"upstream": "https://quay.io"},
            "status": {"endpoint": "m.default:5000",
                       "conditions": [{"type": "Degraded", "status": "False"},
                                      {"type": "Ready", "status": "True"}]}})
    _, body = get(lk, "/apis/eventop.dev/v1/namespaces/default/registrymirrors")
    assert body["rows"][0]["cells"][:4] == ["m", "https://quay.io", "m.default:5000", "True"]
    assert AGE.match(body["rows"][0]["cells"][4])


def test_human_duration_is_apimachinerys() -> None:
    assert [human_duration(s) for s in (-5, -1, 59, 119, 120, 179, 600, 3 * 3600 - 1,
                                        5 * 3600 + 60, 30 * 3600, 3 * 86400 + 3600,
                                        30 * 86400, 3 * 365 * 86400 + 86400 * 5)] == \
        ["<invalid>", "0s", "59s", "119s", "2m", "2m59s", "10m", "179m", "5h1m", "30h",
         "3d1h", "30d", "3y5d"]


def test_unknown_include_object_is_a_bad_request(lk: LocalKube) -> None:
    status, body = get(lk, "/api/v1/namespaces", includeObject="All")
    assert status == 400 and "includeObject" in body["message"]
