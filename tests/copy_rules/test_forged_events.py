"""Forged CloudEvents posted to the router over HTTP cannot make eventop copy anything the
rules do not ask for: the body only says *what to look at*; what is copied, and whether it
is copied at all, is read from the API server.

Runs against the local API server (router under gunicorn) and, with
``EVENTOP_TEST_KUBECONFIG``, against the real one.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

Obj = dict[str, Any]
SELECTED = {"copyrator": "true"}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(ns: str, name: str, data: Obj, labels: Obj | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})},
            "data": data}


@pytest.fixture(params=["local", pytest.param("cluster", marks=pytest.mark.cluster)])
def scene(request: pytest.FixtureRequest) -> Any:
    if request.param == "local":
        pipe = request.getfixturevalue("pipeline")
    else:
        pipe = request.getfixturevalue("cluster_pipeline")
    run = uuid.uuid4().hex[:6]
    src, target = f"forge-{run}-src", f"forge-{run}-target"
    pipe.cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": src}})
    pipe.cluster.put({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": target, "labels": {"forge-run": run}}})
    rule = pipe.cluster.put({
        "apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": f"forge-{run}"},
        "spec": {"ruleType": "secret", "namespaces": [src], "selector": {"matchLabels": SELECTED},
                 "targetNamespaces": {"selector": {"matchLabels": {"forge-run": run}}}}})
    real = pipe.cluster.put(secret(src, "regcred", {"k": b64("real")}, SELECTED))
    unselected = pipe.cluster.put(secret(src, "private", {"k": b64("private")}))
    assert pipe.post("add", rule) == 200
    assert pipe.post("add", real) == 200
    yield pipe, src, target, real, unselected
    if request.param == "cluster":
        pipe.cluster.world.delete("eventop.dev/v1", "CopyRule", f"forge-{run}")
        for ns in (src, target):
            pipe.cluster.world.delete("v1", "Namespace", ns)


def copies(pipe: Any, target: str) -> dict[str, Obj]:
    items = pipe.cluster.kube.list("v1", "Secret", target)
    return {s["metadata"]["name"]: s for s in items
            if s.get("type") != "kubernetes.io/service-account-token"}


def test_a_body_claiming_other_secret_data_copies_the_real_data(scene: Any) -> None:
    pipe, _, target, real, _ = scene
    assert copies(pipe, target)["regcred"]["data"] == {"k": b64("real")}
    forged = {**real, "data": {"k": b64("attacker")}}
    assert pipe.post("update", forged) == 200
    assert copies(pipe, target)["regcred"]["data"] == {"k": b64("real")}


def test_an_event_naming_a_secret_no_rule_selects_copies_nothing(scene: Any) -> None:
    pipe, _, target, _, unselected = scene
    claims_selected = {**unselected, "metadata": {**unselected["metadata"], "labels": SELECTED}}
    assert pipe.post("update", claims_selected) == 200
    assert pipe.post("add", unselected) == 200
    assert set(copies(pipe, target)) == {"regcred"}


def test_an_event_naming_a_secret_that_does_not_exist_copies_nothing(scene: Any) -> None:
    pipe, src, target, _, _ = scene
    ghost = secret(src, "ghost", {"k": b64("invented")}, SELECTED)
    ghost["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1")
    assert pipe.post("add", ghost) == 200
    elsewhere = secret("kube-system", "stolen", {"k": b64("x")}, SELECTED)
    elsewhere["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1")
    # Handled, not retried: 200 if some handler said something about it, 202 if none was
    # concerned (no rule's source, no mirror's credentials: which one depends on what else
    # the router runs, e.g. a handler still waiting for a CRD reports that)
    assert pipe.post("add", elsewhere) in (200, 202)
    assert set(copies(pipe, target)) == {"regcred"}
