"""A parent stored before its CRD was made stricter: the scenario run against the local API
server (tests/engine/test_apiserver.py) and the real one (tests/engine/test_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine import Controller, Desired
from eventop.engine.apiserver import Echoes, KubeWriter
from eventop.engine.kinds import Key
from eventop.engine.reads import Reads
from eventop.engine.run import run
from eventop.handlers import Registry
from eventop.kube import Kube
from eventop.kube.errors import Invalid
from eventop.kube.informer import Cache
from eventop.kube.store import Store
from eventop.testing import wait_until

Obj = dict[str, Any]


def widgets_crd(group: str, *, strict: bool) -> Obj:
    names: Obj = {"type": "array", "items": {"type": "string"}}
    if strict:
        names["minItems"] = 1
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object", "properties": {
                                           "spec": {"type": "object",
                                                    "properties": {"names": names}},
                                           "status": {"type": "object",
                                                      "x-kubernetes-preserve-unknown-fields":
                                                          True}}}}}]}}


def parent_refused_by_a_stricter_crd(kube: Kube, group: str, namespace: str) -> None:
    """Two runs of a controller whose parent its CRD no longer accepts: each raises the
    API server's 422, and one Warning Event says why (the second run posts none)."""
    api_version = f"{group}/v1"
    kube.create(widgets_crd(group, strict=False))
    assert wait_until(lambda: kube.missing_kinds([(api_version, "Widget")]) == [], 30)
    widget = kube.create({"apiVersion": api_version, "kind": "Widget",
                          "metadata": {"name": "w", "namespace": namespace},
                          "spec": {"names": []}})
    crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", f"widgets.{group}")
    kube.replace({**widgets_crd(group, strict=True), "metadata": crd["metadata"]})
    ctl = Controller(f"widgets-{group}", parent=f"{api_version}/Widget",
                     owns=["v1/ConfigMap"], registry=Registry())

    attempts = iter(range(1000))

    @ctl.reconcile
    def want(w: Obj, reads: Any) -> Desired:
        # a new status each run: one the API server took under the old schema (it may serve
        # it for a moment) must not make the later runs write nothing
        return Desired([], status={"attempt": next(attempts)})

    stores = {(api_version, "Widget"): Store(api_version, "Widget"),
              ("v1", "ConfigMap"): Store("v1", "ConfigMap")}
    stores[(api_version, "Widget")].put(widget)
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    seen: dict[str, set[str]] = {}

    def once() -> None:
        current = kube.get(api_version, "Widget", "w", namespace)  # as stored now
        stores[(api_version, "Widget")].put(current)
        reads = Reads(lambda av, k: stores.get((av, k)), ctl.kinds(), ctl.name, current)
        run(ctl, Key(namespace, "w"), current, reads, writer, seen_conflicts=seen)

    def refused() -> bool:  # the real API server may serve the old schema for a moment
        try:
            once()
        except Invalid as exc:
            assert "should have at least 1 items" in str(exc)
            return True
        return False

    assert wait_until(refused, 30)
    with pytest.raises(Invalid):
        once()
    [event] = [e for e in kube.list("v1", "Event", namespace)
               if e["involvedObject"].get("uid") == widget["metadata"]["uid"]]
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "ParentRefused", 1)
    assert event["message"].startswith("the API server refused its status: ")
    assert "spec.names in body should have at least 1 items" in event["message"]
    assert event["message"].endswith(
        "the object as stored does not pass its CustomResourceDefinition's schema (made "
        "stricter since it was stored?): change what that names in its spec; retried with "
        "backoff")
