"""Against a real API server (``pytest -m cluster``, ``EVENTOP_TEST_KUBECONFIG``): every object
a Database becomes is accepted as eventop writes it (server-side apply, v1.24 validation and
defaulting), Jobs and snapshots take the status their controllers would give them (the test
cluster has no kubelet and no snapshot controller, so the test plays them), and the garbage
collector takes exactly the owned objects with the Database, leaving the backup volume, the
credentials Secret and the snapshots."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop.engine import PARENT_UID_LABEL
from eventop.kube import Kube, KubeError, owner_reference
from eventop.testing.cluster import RealCluster
from tests.databases.test_objects import every_object

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
CRDS = [HERE.parents[1] / "crds" / "databases.yaml",
        *sorted((HERE / "schemas").glob("volumesnapshot*.yaml"))]
KEPT = {"Secret", "VolumeSnapshot"}
Obj = dict[str, Any]


def wait_for(predicate: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout}s")


@pytest.fixture
def kube() -> Iterator[Kube]:
    yield RealCluster(os.environ["EVENTOP_TEST_KUBECONFIG"], CRDS).kube


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"eventop-test-db-{uuid.uuid4().hex[:8]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(KubeError):
            kube.delete("v1", "Namespace", name)


def test_every_object_is_accepted_and_the_garbage_collector_takes_only_the_owned(
        kube: Kube, namespace: str) -> None:
    db = kube.create({"apiVersion": "eventop.dev/v1", "kind": "Database",
                      "metadata": {"name": "orders", "namespace": namespace},
                      "spec": {"engine": "postgres", "version": "16", "replicas": 2,
                               "storage": {"size": "1Gi"}}})
    assert db["spec"]["deletionPolicy"] == "Snapshot"  # the CRD's defaults
    assert db["spec"]["backup"] == {"schedule": "0 0 * * *", "retention": 7}
    objects = every_object(db)
    kinds = {o["kind"] for o in objects}
    assert {"StatefulSet", "CronJob", "Job", "VolumeSnapshot", "Secret"} <= kinds
    written: list[Obj] = []
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] in KEPT or obj["metadata"]["name"].endswith("-backups"):
            meta["labels"] = {**meta["labels"], PARENT_UID_LABEL: db["metadata"]["uid"]}
        else:
            meta["ownerReferences"] = [owner_reference(db)]
        written.append(kube.apply(obj))
    # The API server accepted them all; its controllers act on them.
    sts = wait_for(lambda: (kube.get("apps/v1", "StatefulSet", "orders-pg16", namespace)
                            .get("status") or {}).get("observedGeneration"),
                   "the StatefulSet controller")
    assert sts
    pvcs = wait_for(lambda: kube.list("v1", "PersistentVolumeClaim", namespace,
                                      label_selector=f"{PARENT_UID_LABEL}="
                                                     f"{db['metadata']['uid']},"
                                                     "app.kubernetes.io/component=server"),
                    "data volumes made from the claim template")
    assert sorted(p["metadata"]["name"] for p in pvcs) == ["data-orders-pg16-0"]
    # The controllers the cluster lacks: a Job completes, a snapshot turns ready.
    job = kube.patch("batch/v1", "Job", "orders-init", namespace, {"status": {
        "startTime": "2026-11-20T10:00:00Z", "completionTime": "2026-11-20T10:01:00Z",
        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True",
                                        "lastTransitionTime": "2026-11-20T10:01:00Z"}]}},
        subresource="status")
    assert job["status"]["conditions"][0]["type"] == "Complete"
    snapshot = next(o for o in written if o["kind"] == "VolumeSnapshot")
    ready = kube.patch("snapshot.storage.k8s.io/v1", "VolumeSnapshot",
                       snapshot["metadata"]["name"], namespace,
                       {"status": {"readyToUse": True}}, subresource="status")
    assert ready["status"]["readyToUse"] is True
    kube.delete("eventop.dev/v1", "Database", "orders", namespace)

    def owned_gone() -> bool:
        return all(kube.get_or_none(o["apiVersion"], o["kind"], o["metadata"]["name"],
                                    namespace) is None
                   for o in written if o["metadata"].get("ownerReferences"))
    wait_for(owned_gone, "garbage collection of the owned objects", timeout=120)
    for obj in written:
        if not obj["metadata"].get("ownerReferences"):
            assert kube.get_or_none(obj["apiVersion"], obj["kind"], obj["metadata"]["name"],
                                    namespace) is not None, obj["metadata"]["name"]
    assert kube.get_or_none("v1", "PersistentVolumeClaim", "data-orders-pg16-0", namespace)


def test_the_api_server_refuses_what_the_schema_can_say(kube: Kube, namespace: str) -> None:
    from eventop.kube import Invalid

    base = {"apiVersion": "eventop.dev/v1", "kind": "Database",
            "metadata": {"name": "bad", "namespace": namespace}}
    for spec, field in (({"engine": "mysql", "version": "16", "storage": {"size": "1Gi"}},
                         "spec.engine"),
                        ({"engine": "postgres", "version": "16", "storage": {}},
                         "spec.storage.size"),
                        ({"engine": "postgres", "version": "sixteen",
                          "storage": {"size": "1Gi"}}, "spec.version"),
                        ({"engine": "postgres", "version": "16", "storage": {"size": "1Gi"},
                          "deletionPolicy": "Orphan"}, "spec.deletionPolicy")):
        with pytest.raises(Invalid) as err:
            kube.create({**base, "spec": spec})
        assert field in str(err.value)
