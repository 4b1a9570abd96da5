"""What the controllers of a real cluster do: GC, namespace termination, PVC binding, CRDs."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.kube import Kube, errors
from eventop.localkube import LocalKube
from eventop.testing.waiting import wait_until
from tests.localkube.support import REPO, Http, cm


def _owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _owned(name: str, namespace: str, *owners: dict[str, Any]) -> dict[str, Any]:
    """Owned by every one of ``owners``; the first is the controller (the API server allows
    only one)."""
    obj = cm(name, namespace)
    refs = [_owner_ref(o) for o in owners]
    for ref in refs[1:]:
        ref["controller"] = False
    obj["metadata"]["ownerReferences"] = refs
    return obj


def test_deleting_an_owner_deletes_its_dependents_across_namespaces(
        lk: LocalKube, k: Kube, http: Http) -> None:
    rule = k.create({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                     "metadata": {"name": "r"},
                     "spec": {"ruleType": "configmap", "namespaces": ["default"]}})
    k.create(_owned("copy", "default", rule))
    k.create(_owned("copy", "kube-public", rule))
    grandchild = _owned("grandchild", "default", k.get("v1", "ConfigMap", "copy", "default"))
    k.create(grandchild)
    rv = str(lk.resource_version)
    k.delete("eventop.dev/v1", "CopyRule", "r")
    assert k.list("v1", "ConfigMap", label_selector=None) == [
        o for o in k.list("v1", "ConfigMap") if o["metadata"]["name"] == "kube-root-ca.crt"]
    events = http.watch("/api/v1/configmaps", resourceVersion=rv, timeoutSeconds=0.3)
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [
        ("DELETED", "copy"), ("DELETED", "copy"), ("DELETED", "grandchild")]


def test_a_dependent_with_a_surviving_owner_stays_and_loses_the_dead_reference(
        k: Kube) -> None:
    a, b = k.create(cm("a")), k.create(cm("b"))
    k.create(_owned("child", "default", a, b))
    k.delete("v1", "ConfigMap", "a", "default")
    child = k.get("v1", "ConfigMap", "child", "default")
    assert [r["name"] for r in child["metadata"]["ownerReferences"]] == ["b"]


def test_orphan_propagation_keeps_dependents(k: Kube) -> None:
    owner = k.create(cm("owner"))
    k.create(_owned("child", "default", owner))
    k.delete("v1", "ConfigMap", "owner", "default", propagation="Orphan")
    child = k.get("v1", "ConfigMap", "child", "default")
    assert "ownerReferences" not in child["metadata"]


def test_deleting_a_namespace_terminates_it_and_deletes_its_content(lk: LocalKube, k: Kube,
                                                                    http: Http) -> None:
    k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    k.create(cm("x", "team-b"))
    rv = str(lk.resource_version)
    k.delete("v1", "Namespace", "team-b")
    assert k.get_or_none("v1", "Namespace", "team-b") is None
    assert k.list("v1", "ConfigMap", "team-b") == []
    ns_events = http.watch("/api/v1/namespaces", resourceVersion=rv, timeoutSeconds=0.3)
    assert [(e["type"], e["object"]["status"]["phase"]) for e in ns_events] == [
        ("MODIFIED", "Terminating"), ("MODIFIED", "Terminating"), ("DELETED", "Terminating")]
    assert ns_events[0]["object"]["metadata"]["deletionTimestamp"]


def test_a_namespace_with_finalized_content_stays_terminating_until_it_is_released(
        k: Kube) -> None:
    k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "slow"}})
    held = cm("held", "slow")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    k.create(held)
    k.delete("v1", "Namespace", "slow")
    assert k.get("v1", "Namespace", "slow")["status"]["phase"] == "Terminating"
    with pytest.raises(errors.Forbidden) as caught:
        k.create(cm("new", "slow"))
    assert caught.value.causes[0]["reason"] == "NamespaceTerminating"
    k.patch("v1", "ConfigMap", "held", "slow", {"metadata": {"finalizers": None}})
    assert k.get_or_none("v1", "Namespace", "slow") is None


def test_new_namespaces_get_the_name_label_and_a_root_ca_configmap(k: Kube) -> None:
    ns = k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}})
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "fresh"}
    assert ns["status"] == {"phase": "Active"} and ns["spec"] == {"finalizers": ["kubernetes"]}
    assert [o["metadata"]["name"] for o in k.list("v1", "ConfigMap", "fresh")] == [
        "kube-root-ca.crt"]


def _claim(size: str = "1Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}}


def test_claims_are_bound_at_once_and_may_grow_but_not_shrink(k: Kube) -> None:
    claim = k.apply(_claim("1Gi"))
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["capacity"] == {"storage": "1Gi"}
    assert k.apply(_claim("2Gi"))["spec"]["resources"]["requests"]["storage"] == "2Gi"
    with pytest.raises(errors.Invalid, match="can not be less than previous value"):
        k.apply(_claim("1Gi"))
    changed = _claim("2Gi")
    changed["spec"]["accessModes"] = ["ReadWriteMany"]
    with pytest.raises(errors.Invalid, match="spec is immutable after creation"):
        k.apply(changed)


def test_claims_stay_pending_when_binding_is_off() -> None:
    with LocalKube(crd_dir=REPO / "crds", bind_pvcs=False) as server:
        claim = Kube.connect(url=server.url).apply(_claim())
    assert claim["status"] == {"phase": "Pending"}


def test_a_crd_created_through_the_api_is_served_and_validated(k: Kube, http: Http) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {
                                      "type": "object", "properties": {"spec": {
                                          "type": "object", "required": ["size"],
                                          "properties": {"size": {"type": "integer"}}}}}}}]}}
    created = k.create(crd)
    assert {c["type"] for c in created["status"]["conditions"]} == {"Established",
                                                                    "NamesAccepted"}
    widget = {"apiVersion": "example.com/v1", "kind": "Widget",
              "metadata": {"name": "w", "namespace": "default"},
              "spec": {"size": 3, "unknown": "pruned"}}
    assert k.create(widget)["spec"] == {"size": 3}
    with pytest.raises(errors.Invalid, match=r"spec\.size: Required value"):
        k.create({**widget, "metadata": {"name": "w2", "namespace": "default"}, "spec": {}})
    k.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", "widgets.example.com")
    assert http.call("GET", "/apis/example.com/v1/widgets")[0] == 404


def test_the_repository_crds_are_installed_at_start(k: Kube) -> None:
    names = {c["metadata"]["name"] for c in
             k.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")}
    assert names == {"copyrules.eventop.dev", "databases.eventop.dev", "exchangerates.eventop.dev",
                     "registrymirrors.eventop.dev"}


def test_system_namespaces_cannot_be_deleted(k: Kube) -> None:
    with pytest.raises(errors.Forbidden, match="this namespace may not be deleted"):
        k.delete("v1", "Namespace", "default")
    assert k.get("v1", "Namespace", "default")["status"]["phase"] == "Active"


def test_with_a_namespace_delay_content_outlives_the_terminating_namespace_for_a_while(
        ) -> None:
    with LocalKube(crd_dir=REPO / "crds", namespace_delay=0.2) as server:
        kube = Kube.connect(url=server.url)
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "slow"}})
        kube.create(cm("x", "slow"))
        kube.delete("v1", "Namespace", "slow")
        terminating = kube.get("v1", "Namespace", "slow")
        content = kube.get_or_none("v1", "ConfigMap", "x", "slow")
        with pytest.raises(errors.Forbidden):
            kube.create(cm("y", "slow"))
        assert server.wait_idle()
        gone = kube.get_or_none("v1", "Namespace", "slow")
        leftovers = kube.list("v1", "ConfigMap", "slow")
    assert terminating["status"]["phase"] == "Terminating" and content is not None
    assert gone is None and leftovers == []


def test_with_gc_dangling_objects_with_a_missing_or_foreign_owner_are_collected() -> None:
    with LocalKube(crd_dir=REPO / "crds", gc_dangling=True) as server:
        kube = Kube.connect(url=server.url)
        owner = kube.create(cm("owner"))
        foreign = kube.create(cm("foreign", "kube-public"))
        made_up = {**owner, "metadata": {**owner["metadata"], "uid": "no-such-uid"}}
        kube.create(_owned("ghost", "default", made_up))
        kube.create(_owned("cross-namespace", "default", foreign))
        kube.create(_owned("half", "default", owner, made_up))
        kube.create(_owned("fine", "default", owner))
        names = {o["metadata"]["name"] for o in kube.list("v1", "ConfigMap", "default")}
        half = kube.get("v1", "ConfigMap", "half", "default")
    assert names == {"owner", "half", "fine", "kube-root-ca.crt"}
    assert [r["uid"] for r in half["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]


def test_a_namespace_with_a_dangling_owner_is_created_then_collected() -> None:
    """As the real server answers 201 and its garbage collector removes the namespace later:
    a recorded team namespace owned by a parent of another run replays (the root-CA
    publisher crashed the put when the namespace went at once)."""
    with LocalKube(crd_dir=REPO / "crds", gc_dangling=True) as server:
        stored = server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "team-delta", "ownerReferences": [{
                "apiVersion": "example.com/v1", "kind": "TeamNamespace", "name": "delta",
                "uid": "no-such-uid", "controller": True}]}})
        assert stored["metadata"]["name"] == "team-delta"
        assert wait_until(lambda: server.get("v1", "Namespace", "team-delta") is None, 10)


def test_foreground_deletion_removes_dependents_before_the_owner(lk: LocalKube, k: Kube,
                                                                 http: Http) -> None:
    owner = k.create(cm("owner"))
    k.create(_owned("child", "default", owner))
    rv = str(lk.resource_version)
    k.delete("v1", "ConfigMap", "owner", "default", propagation="Foreground")
    events = http.watch("/api/v1/namespaces/default/configmaps", resourceVersion=rv,
                        timeoutSeconds=0.3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("DELETED", "child"), ("DELETED", "owner")]
