"""CopyRule scenarios against a real cluster (``EVENTOP_TEST_KUBECONFIG``; skipped without).

Every run creates its own uniquely named namespaces and a rule that targets only namespaces
carrying this run's label, so nothing outside the test is ever copied into; everything is
deleted afterwards. The real garbage collector, admission and namespace lifecycle are used.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


@pytest.fixture
def run(cluster_pipeline: Any) -> Iterator[dict[str, Any]]:
    world = cluster_pipeline.cluster.world
    cluster_pipeline.cluster.install_crds([REPO / "crds" / "copyrules.yaml"])
    run_id = uuid.uuid4().hex[:6]
    names = {k: f"eventop-copy-{run_id}-{k}" for k in ("src", "t1", "t2", "t3")}
    info = {"id": run_id, "ns": names, "rule": f"eventop-test-{run_id}",
            "label": {"eventop.dev/test-run": run_id}}
    try:
        yield info
    finally:
        world.delete("eventop.dev/v1", "CopyRule", info["rule"])
        for ns in names.values():
            world.delete("v1", "Namespace", ns)


def ns_obj(name: str, labels: Obj | None = None) -> Obj:
    meta: Obj = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def rule_body(run: dict[str, Any], rule_type: str) -> Obj:
    """This run's rule: sources labelled copyrator=true in its src namespace, copied only into
    namespaces carrying this run's label."""
    return {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": run["rule"]},
            "spec": {"ruleType": rule_type, "namespaces": [run["ns"]["src"]],
                     "selector": {"matchLabels": {"copyrator": "true"}},
                     "targetNamespaces": {"selector": {"matchLabels": run["label"]}}}}


def get_cm(p: Any, ns: str, name: str = "app-config") -> Obj | None:
    found: Obj | None = p.cluster.kube.get_or_none("v1", "ConfigMap", name, ns)
    return found


def test_copies_follow_namespaces_sources_hand_edits_and_the_rule(
        cluster_pipeline: Any, run: dict[str, Any]) -> None:
    p, ns = cluster_pipeline, run["ns"]
    for key in ("src", "t1", "t2"):
        p.post("add", p.cluster.put(ns_obj(ns[key], run["label"] if key != "src" else {})))
    source = p.cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "app-config", "namespace": ns["src"],
                                         "labels": {"copyrator": "true"}},
                            "data": {"mirror": "m:5000"}})
    rule = p.cluster.put(rule_body(run, "configmap"))
    assert p.post("add", rule) == 200
    for key in ("t1", "t2"):
        copy = p.cluster.wait_for(lambda k=key: get_cm(p, ns[k]), what=f"copy in {key}")
        assert copy["data"] == {"mirror": "m:5000"}
        assert copy["metadata"]["ownerReferences"][0]["uid"] == \
            p.cluster.kube.get("eventop.dev/v1", "CopyRule", run["rule"])["metadata"]["uid"]

    # a hand-made object where a copy would go is left alone and reported
    p.cluster.put(ns_obj(ns["t3"]))
    p.cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "app-config", "namespace": ns["t3"],
                                "labels": {"app.kubernetes.io/managed-by": "eventop"}},
                   "data": {"mirror": "hand-made"}})
    assert p.post("update", p.cluster.put(ns_obj(ns["t3"], run["label"]))) == 200

    def conflict_reported() -> Obj | None:
        status = p.cluster.kube.get("eventop.dev/v1", "CopyRule", run["rule"]).get("status")
        return status if (status or {}).get("conflicts") == 1 else None

    status = p.cluster.wait_for(conflict_reported, what="conflict reported")
    assert status["conflictList"] == [f"{ns['t3']}/app-config"]
    assert get_cm(p, ns["t3"])["data"] == {"mirror": "hand-made"}

    # the source changes: every copy follows
    source["data"] = {"mirror": "m:5001"}
    assert p.post("update", p.cluster.put(source)) == 200
    for key in ("t1", "t2"):
        p.cluster.wait_for(lambda k=key: (get_cm(p, ns[k]) or {}).get("data") ==
                           {"mirror": "m:5001"}, what=f"updated copy in {key}")

    # a copy deleted by hand comes back
    gone = get_cm(p, ns["t1"])
    p.cluster.world.delete("v1", "ConfigMap", "app-config", ns["t1"])
    assert p.post("delete", gone) == 200
    p.cluster.wait_for(lambda: get_cm(p, ns["t1"]), what="restored copy")

    # deleting the rule: the garbage collector removes the copies, not the hand-made object
    p.cluster.world.delete("eventop.dev/v1", "CopyRule", run["rule"])
    p.cluster.wait_for(lambda: get_cm(p, ns["t1"]) is None and get_cm(p, ns["t2"]) is None,
                       timeout=120, what="copies garbage-collected")
    assert get_cm(p, ns["t3"])["data"] == {"mirror": "hand-made"}
    assert get_cm(p, ns["src"])["data"] == {"mirror": "m:5001"}


def test_secret_copies_keep_their_type_and_tokens_are_not_copied(
        cluster_pipeline: Any, run: dict[str, Any]) -> None:
    p, ns = cluster_pipeline, run["ns"]
    p.cluster.put(ns_obj(ns["src"]))
    p.cluster.put(ns_obj(ns["t1"], run["label"]))
    dockercfg = p.cluster.put({"apiVersion": "v1", "kind": "Secret",
                               "type": "kubernetes.io/dockerconfigjson",
                               "metadata": {"name": "regcred", "namespace": ns["src"],
                                            "labels": {"copyrator": "true"}},
                               "data": {".dockerconfigjson": "eyJhdXRocyI6e319"}})
    p.cluster.put({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "builder", "namespace": ns["src"]}})
    p.cluster.put({"apiVersion": "v1", "kind": "Secret",
                   "type": "kubernetes.io/service-account-token",
                   "metadata": {"name": "builder-token", "namespace": ns["src"],
                                "labels": {"copyrator": "true"},
                                "annotations": {"kubernetes.io/service-account.name": "builder"}}})
    rule = p.cluster.put(rule_body(run, "secret"))
    assert p.post("add", rule) == 200
    copy = p.cluster.wait_for(
        lambda: p.cluster.kube.get_or_none("v1", "Secret", "regcred", ns["t1"]), what="Secret copy")
    assert copy["type"] == "kubernetes.io/dockerconfigjson"
    assert copy["data"] == dockercfg["data"]
    assert p.cluster.kube.get_or_none("v1", "Secret", "builder-token", ns["t1"]) is None
    status = p.cluster.kube.get("eventop.dev/v1", "CopyRule", run["rule"])["status"]
    assert (status["sources"], status["copies"]) == (1, 1)


def test_copies_orphaned_with_the_rule_are_adopted_by_the_rule_applied_again(
        cluster_pipeline: Any, run: dict[str, Any]) -> None:
    p, ns = cluster_pipeline, run["ns"]
    p.cluster.put(ns_obj(ns["src"]))
    p.cluster.put(ns_obj(ns["t1"], run["label"]))
    p.cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "app-config", "namespace": ns["src"],
                                "labels": {"copyrator": "true"}},
                   "data": {"mirror": "m:5000"}})
    body = rule_body(run, "configmap")
    assert p.post("add", p.cluster.put(body)) == 200
    p.cluster.wait_for(lambda: get_cm(p, ns["t1"]), what="copy")
    p.cluster.world.delete("eventop.dev/v1", "CopyRule", run["rule"], propagation="Orphan")

    def orphaned() -> bool:
        copy = get_cm(p, ns["t1"])  # the garbage collector strips the ownerReference
        return copy is not None and not copy["metadata"].get("ownerReferences")
    p.cluster.wait_for(orphaned, timeout=120, what="orphaned copy")
    p.cluster.wait_for(
        lambda: p.cluster.kube.get_or_none("eventop.dev/v1", "CopyRule", run["rule"]) is None,
        what="rule gone")
    rule = p.cluster.put(body)
    assert p.post("add", rule) == 200
    adopted = p.cluster.wait_for(lambda: (get_cm(p, ns["t1"]) or {"metadata": {}})["metadata"]
                                 .get("ownerReferences"), what="adopted copy")
    assert [r["uid"] for r in adopted] == [rule["metadata"]["uid"]]
    status = p.cluster.kube.get("eventop.dev/v1", "CopyRule", run["rule"])["status"]
    assert (status["copies"], status["conflicts"]) == (1, 0)


@pytest.mark.parametrize("pipeline_workers", [1])
def test_a_copy_held_by_a_finalizer_when_deleted_comes_back_once_it_is_gone(
        cluster_pipeline: Any, run: dict[str, Any]) -> None:
    """The rule deletes a copy someone's finalizer holds, then wants it again while it is
    still going: the run skips it, and its final disappearance must start the run that
    makes it again (it used to be dropped as the echo of the rule's own delete)."""
    p, ns = cluster_pipeline, run["ns"]
    p.cluster.put(ns_obj(ns["src"]))
    p.cluster.put(ns_obj(ns["t1"], run["label"]))
    source = p.cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "app-config", "namespace": ns["src"],
                                         "labels": {"copyrator": "true"}},
                            "data": {"mirror": "m:5000"}})
    assert p.post("add", p.cluster.put(rule_body(run, "configmap"))) == 200
    p.cluster.wait_for(lambda: get_cm(p, ns["t1"]), what="copy")
    kube = p.cluster.kube
    kube.patch("v1", "ConfigMap", "app-config", ns["t1"],
               {"metadata": {"finalizers": ["example.com/hold"]}})
    source["metadata"]["labels"] = {}
    source = p.cluster.put(source)
    assert p.post("update", source) == 200
    p.cluster.wait_for(lambda: (get_cm(p, ns["t1"]) or {}).get("metadata", {})
                       .get("deletionTimestamp"), what="copy being deleted")
    time.sleep(1.0)  # the router's cache holds the copy going: the next run skips it
    source["metadata"]["labels"] = {"copyrator": "true"}
    assert p.post("update", p.cluster.put(source)) == 200
    held = get_cm(p, ns["t1"])
    assert held is not None and held["metadata"].get("deletionTimestamp")
    kube.patch("v1", "ConfigMap", "app-config", ns["t1"], {"metadata": {"finalizers": None}})
    p.cluster.wait_for(lambda: get_cm(p, ns["t1"]) is None, what="held copy gone")
    time.sleep(1.0)  # the order of a real watcher: the router's own watch sees it go first
    p.post("delete", held)
    again = p.cluster.wait_for(
        lambda: (c := get_cm(p, ns["t1"])) is not None
        and not c["metadata"].get("deletionTimestamp") and c, what="copy made again")
    assert again["data"] == {"mirror": "m:5000"}
    assert again["metadata"]["uid"] != held["metadata"]["uid"]
