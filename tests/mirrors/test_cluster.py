"""RegistryMirror scenarios against a real API server (``pytest -m cluster``).

What only a real cluster shows: the API server's own validation and defaulting of every
generated object (server-side apply), its answer to a PVC resize (granted where the claim is
bound and the class expands, else 422/403 reported in a condition), and the garbage
collector removing everything owned by a deleted mirror. The router runs on this machine
(``cluster_pipeline``). Each test works in its own namespace and deletes it afterwards;
hostPorts are drawn at random so parallel runs and other mirrors on the cluster do not
collide. Pods are not waited for: whether nginx and registry images can be pulled is the
cluster's business, not this suite's.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop.handlers.mirrors.build import Names
from eventop.kube.errors import KubeError

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
RM = ("eventop.dev/v1", "RegistryMirror")
Obj = dict[str, Any]


@pytest.fixture
def pipeline_env() -> dict[str, str]:
    return {"EVENTOP_BUILTIN_HANDLERS": "mirrors"}


def ensure_crd(pipe: Any) -> None:
    pipe.cluster.install_crds([REPO / "crds" / "registrymirrors.yaml"])


@pytest.fixture
def namespace(cluster_pipeline: Any) -> Iterator[str]:
    ensure_crd(cluster_pipeline)
    name = f"eventop-test-mirrors-{uuid.uuid4().hex[:8]}"
    # the node proxy's hostPort is refused by Pod Security baseline/restricted
    cluster_pipeline.cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    try:
        yield name
    finally:
        with contextlib.suppress(KeyError, KubeError):
            cluster_pipeline.cluster.world.delete("v1", "Namespace", name)


def free_port() -> int:
    return random.randint(20000, 29999)


def mirror(name: str, namespace: str, **spec: Any) -> Obj:
    spec.setdefault("upstream", "https://registry-1.docker.io")
    return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def put_and_post(pipe: Any, obj: Obj, change: str = "add") -> Obj:
    stored: Obj = pipe.cluster.put(obj)
    assert pipe.post(change, stored) in (200, 202)
    return stored


def owned(pipe: Any, name: str, namespace: str) -> dict[str, Obj | None]:
    names = Names.of(name)
    get = pipe.cluster.kube.get_or_none
    return {
        "pvc": get("v1", "PersistentVolumeClaim", names.pvc, namespace),
        "headless": get("v1", "Service", names.headless_service, namespace),
        "service": get("v1", "Service", names.service, namespace),
        "sts": get("apps/v1", "StatefulSet", names.statefulset, namespace),
        "ds": get("apps/v1", "DaemonSet", names.daemonset, namespace),
    }


def condition(pipe: Any, name: str, namespace: str, type_: str) -> Obj:
    status = pipe.cluster.kube.get(*RM, name, namespace).get("status") or {}
    return next(c for c in status.get("conditions") or [] if c["type"] == type_)


def test_mirror_lifecycle_on_a_real_cluster(cluster_pipeline: Any, namespace: str) -> None:
    pipe = cluster_pipeline
    port = free_port()
    stored = put_and_post(pipe, mirror("hub", namespace, hostPort=port,
                                       storage={"size": "1Gi"}))
    objs = owned(pipe, "hub", namespace)
    assert all(objs.values()), {k: v is not None for k, v in objs.items()}
    for obj in objs.values():
        assert obj is not None
        assert obj["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    headless = objs["headless"]
    assert headless is not None and headless["spec"]["clusterIP"] == "None"
    service = objs["service"]
    assert service is not None and service["spec"]["clusterIP"] not in ("", "None")
    status = pipe.cluster.kube.get(*RM, "hub", namespace)["status"]
    assert status["endpoint"] == f"localhost:{port}"
    assert status["hostPort"] == port  # kept by the CRD's status schema, not pruned
    assert status["observedGeneration"] == 1
    assert condition(pipe, "hub", namespace, "Degraded")["status"] == "False"

    # the workloads' own events refresh the status without errors
    sts = pipe.cluster.kube.get("apps/v1", "StatefulSet", Names.of("hub").statefulset, namespace)
    assert pipe.post("update", sts) in (200, 202)

    # a second event changes nothing: the real API server treats the applies as no-ops
    # (only the Services are compared: controllers write the workloads' status and the
    # binder the claim's at any moment)
    def service_rvs() -> dict[str, str]:
        objs = owned(pipe, "hub", namespace)
        return {k: str((objs[k] or {})["metadata"]["resourceVersion"])
                for k in ("headless", "service")}
    rvs = service_rvs()
    assert pipe.post("update", pipe.cluster.kube.get(*RM, "hub", namespace)) in (200, 202)
    assert service_rvs() == rvs

    # grown: resized where the cluster can, else the server's refusal is in the condition
    grown = mirror("hub", namespace, hostPort=port, storage={"size": "2Gi"},
                   upstream="https://mirror.gcr.io")
    put_and_post(pipe, grown, "update")
    pvc = pipe.cluster.kube.get("v1", "PersistentVolumeClaim", Names.of("hub").pvc, namespace)
    degraded = condition(pipe, "hub", namespace, "Degraded")
    if pvc["spec"]["resources"]["requests"]["storage"] != "2Gi":
        assert (degraded["status"], degraded["reason"]) == ("True", "ResizeRefused")
        assert "PersistentVolumeClaim" in degraded["message"]
    sts = pipe.cluster.kube.get("apps/v1", "StatefulSet", Names.of("hub").statefulset, namespace)
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0][
        "env"]}
    assert env["REGISTRY_PROXY_REMOTEURL"] == "https://mirror.gcr.io"

    # deleted: the garbage collector removes everything it owned
    last = pipe.cluster.kube.get(*RM, "hub", namespace)
    pipe.cluster.remove(*RM, "hub", namespace)
    assert pipe.post("delete", last) in (200, 202)
    # (the claim may linger as Terminating until its pod is gone: pvc-protection finalizer)
    def collected() -> bool:
        left = owned(pipe, "hub", namespace)
        pvc = left.pop("pvc")
        return all(v is None for v in left.values()) and (
            pvc is None or bool(pvc["metadata"].get("deletionTimestamp")))
    pipe.cluster.wait_for(collected, timeout=120,
                          what="objects of the deleted mirror garbage-collected")


def test_host_port_conflict_and_missing_secret_on_a_real_cluster(
        cluster_pipeline: Any, namespace: str) -> None:
    pipe = cluster_pipeline
    port = free_port()
    put_and_post(pipe, mirror("first", namespace, hostPort=port))
    put_and_post(pipe, mirror("second", namespace, hostPort=port, upstream="https://quay.io"))
    degraded = condition(pipe, "second", namespace, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert not any(owned(pipe, "second", namespace).values())
    events = [e for e in pipe.cluster.kube.list("v1", "Event", namespace)
              if e["involvedObject"].get("name") == "second"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "HostPortConflict")]

    put_and_post(pipe, mirror("private", namespace, hostPort=free_port(),
                              upstream="https://registry.example.com",
                              credentialsSecretRef={"name": "nope"}))
    degraded = condition(pipe, "private", namespace, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CredentialsSecretMissing")
    secret = pipe.cluster.put({"apiVersion": "v1", "kind": "Secret", "type":
                               "kubernetes.io/basic-auth",
                               "metadata": {"name": "nope", "namespace": namespace},
                               "stringData": {"username": "u", "password": "p"}})
    assert pipe.post("add", secret) in (200, 202)
    assert condition(pipe, "private", namespace, "Degraded")["status"] == "False"
    assert all(owned(pipe, "private", namespace).values())


def test_a_daemonset_deleted_by_hand_comes_back_on_the_port_its_mirror_holds(
        cluster_pipeline: Any, namespace: str) -> None:
    """The newer mirror serves the port an older one moves onto; its DaemonSet deleted by
    hand is created again on that port, the older one still held back."""
    pipe = cluster_pipeline
    old_port, port = free_port(), free_port()
    put_and_post(pipe, mirror("b1", namespace, hostPort=old_port))
    put_and_post(pipe, mirror("w1", namespace, hostPort=port))
    put_and_post(pipe, mirror("b1", namespace, hostPort=port), "update")
    assert condition(pipe, "b1", namespace, "Degraded")["reason"] == "HostPortConflict"
    ds = owned(pipe, "w1", namespace)["ds"]
    assert ds is not None
    pipe.cluster.remove("apps/v1", "DaemonSet", ds["metadata"]["name"], namespace)
    pipe.cluster.wait_for(lambda: owned(pipe, "w1", namespace)["ds"] is None
                          or owned(pipe, "w1", namespace)["ds"]["metadata"]["uid"]
                          != ds["metadata"]["uid"], timeout=60, what="DaemonSet deleted")
    assert pipe.post("delete", ds) in (200, 202)
    again = owned(pipe, "w1", namespace)["ds"]
    assert again is not None and again["metadata"]["uid"] != ds["metadata"]["uid"]
    assert again["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] == port
    assert condition(pipe, "w1", namespace, "Degraded")["status"] == "False"
    assert condition(pipe, "b1", namespace, "Degraded")["reason"] == "HostPortConflict"
    b1_ds = owned(pipe, "b1", namespace)["ds"]
    assert b1_ds is not None
    assert b1_ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] == \
        old_port
