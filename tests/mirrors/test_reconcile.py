"""The RegistryMirror controller against the local API server (over HTTP, real client paths),
run by the reconcile engine as the router runs it (cache, queue, writes)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop import handlers
from eventop.engine.runtime import Engine
from eventop.events import REF_PREFIX
from eventop.handlers.events import Event
from eventop.handlers.mirrors.build import Names
from eventop.handlers.mirrors.desired import credentials_digest
from eventop.kube import Kube
from tests.mirrors.support import (
    env_of,
    rolled_out_daemonset_status,
    rolled_out_statefulset_status,
)
from tests.support.engine import deliver, running_engine, wait_cached

Obj = dict[str, Any]
NS = "registry-mirrors"
REPO = Path(__file__).resolve().parents[2]
OWNED_KINDS = (("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("apps/v1", "StatefulSet"),
               ("apps/v1", "DaemonSet"))


def new_mirror(name: str, **spec: Any) -> Obj:
    spec.setdefault("upstream", "https://registry-1.docker.io")
    return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


@pytest.fixture
def world(local_kube: Any) -> Any:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return local_kube


@pytest.fixture
def engine(world: Any, kube: Kube) -> Iterator[Engine]:
    with running_engine(kube, handlers.load("", builtin="mirrors")) as running:
        yield running


def handled(engine: Engine, event: Event) -> str:
    """Deliver the event; what was done, one line per run (or why nothing ran)."""
    outcomes = deliver(engine, event)
    failed = [o.detail for o in outcomes if not o.ok]
    assert not failed, failed
    return "; ".join(o.detail for o in outcomes)


def put(world: Any, obj: Obj) -> Obj:
    stored: Obj = world.put(copy.deepcopy(obj))
    return stored


def mirror_event(world: Any, engine: Engine, name: str, change: str = "update") -> str:
    obj = world.get("eventop.dev/v1", "RegistryMirror", name, NS)
    if obj is None:  # deleted: the event carries its last state
        obj = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
               "metadata": {"name": name, "namespace": NS}}
    return handled(engine, Event.for_object(change, obj))


def owned_objects(world: Any, name: str) -> dict[tuple[str, str], Obj]:
    out = {}
    for api_version, kind in OWNED_KINDS:
        for obj in world.list(api_version, kind, NS):
            labels = obj["metadata"].get("labels") or {}
            if labels.get("app.kubernetes.io/instance") == name:
                out[(kind, obj["metadata"]["name"])] = obj
    return out


def status_of(world: Any, name: str) -> Obj:
    status: Obj = world.get("eventop.dev/v1", "RegistryMirror", name, NS).get("status") or {}
    return status


def condition(world: Any, name: str, type_: str) -> Obj:
    return next(c for c in status_of(world, name).get("conditions", []) if c["type"] == type_)


def events_about(world: Any, name: str) -> list[Obj]:
    return [e for e in world.list("v1", "Event", NS)
            if e["involvedObject"].get("name") == name
            and e["involvedObject"].get("kind") == "RegistryMirror"]


def sts_of(world: Any, name: str) -> Obj | None:
    found: Obj | None = world.get("apps/v1", "StatefulSet", Names.of(name).statefulset, NS)
    return found


def pvc_size(world: Any, name: str) -> str:
    pvc = world.get("v1", "PersistentVolumeClaim", Names.of(name).pvc, NS)
    return str(pvc["spec"]["resources"]["requests"]["storage"])


def mark_workloads_ready(world: Any, engine: Engine, name: str, nodes: int = 2) -> None:
    """Play the StatefulSet and DaemonSet controllers, and send their update events."""
    names = Names.of(name)
    sts = world.get("apps/v1", "StatefulSet", names.statefulset, NS)
    sts["status"] = rolled_out_statefulset_status(sts)
    sts = world.put(sts)
    handled(engine, Event.for_object("update", sts))
    ds = world.get("apps/v1", "DaemonSet", names.daemonset, NS)
    ds["status"] = rolled_out_daemonset_status(ds, nodes)
    ds = world.put(ds)
    handled(engine, Event.for_object("update", ds))


# -- creation, status, updates ------------------------------------------------------------


def test_a_new_mirror_gets_its_five_objects_and_a_status(world: Any, engine: Engine) -> None:
    mirror = put(world, new_mirror("docker-hub", hostPort=5001, storage={"size": "20Gi"}))
    mirror_event(world, engine, "docker-hub", "add")
    objs = owned_objects(world, "docker-hub")
    assert sorted(objs) == [
        ("DaemonSet", "mirror-docker-hub-node"),
        ("PersistentVolumeClaim", "mirror-docker-hub-cache"),
        ("Service", "mirror-docker-hub"), ("Service", "mirror-docker-hub-hl"),
        ("StatefulSet", "mirror-docker-hub")]
    for obj in objs.values():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == mirror["metadata"]["uid"]
    assert env_of(sts_of(world, "docker-hub"))["REGISTRY_PROXY_REMOTEURL"]["value"] == \
        "https://registry-1.docker.io"
    assert pvc_size(world, "docker-hub") == "20Gi"
    status = status_of(world, "docker-hub")
    assert status["endpoint"] == "localhost:5001"
    assert status["serviceURL"] == "http://mirror-docker-hub.registry-mirrors.svc.cluster.local:5000"
    assert status["observedGeneration"] == mirror["metadata"]["generation"]
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"
    ready = condition(world, "docker-hub", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RegistryNotReady")


def test_ready_follows_the_workloads_own_status(world: Any, engine: Engine) -> None:
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    mark_workloads_ready(world, engine, "quay", nodes=3)
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert "3 node(s)" in ready["message"]
    # a node proxy goes unready
    ds = world.get("apps/v1", "DaemonSet", Names.of("quay").daemonset, NS)
    ds["status"]["numberReady"] = 2
    handled(engine, Event.for_object("update", world.put(ds)))
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NodeProxyNotReady")


def test_a_second_reconcile_writes_nothing(world: Any, engine: Engine, kube: Kube) -> None:
    put(world, new_mirror("docker-hub", hostPort=5001))
    mirror_event(world, engine, "docker-hub", "add")
    mark_workloads_ready(world, engine, "docker-hub")
    # the watcher's event of the last status write: the engine knows it as its own echo
    assert mirror_event(world, engine, "docker-hub") == "echo of its own write"
    before = {k: o["metadata"]["resourceVersion"] for k, o in owned_objects(
        world, "docker-hub").items()}
    mirror_rv = world.get("eventop.dev/v1", "RegistryMirror", "docker-hub", NS)[
        "metadata"]["resourceVersion"]
    # The log is appended after each answer is sent; a request on the same keep-alive
    # connection is served only after the previous one was logged.
    kube.ping()
    seen = len(world.requests)
    # "add" (a restarted watcher's, a resync's) always runs: an update with nothing new
    # would not even start one
    done = mirror_event(world, engine, "docker-hub", "add")
    kube.ping()
    after = {k: o["metadata"]["resourceVersion"] for k, o in owned_objects(
        world, "docker-hub").items()}
    assert after == before
    assert world.get("eventop.dev/v1", "RegistryMirror", "docker-hub", NS)[
        "metadata"]["resourceVersion"] == mirror_rv
    assert f"{NS}/docker-hub: 0 created, 0 updated, 0 deleted, 5 unchanged" in done
    new_requests = world.requests[seen:]
    assert not [r for r in new_requests if r[0] in ("POST", "PUT", "DELETE")]
    assert not [r for r in new_requests if r[0] == "PATCH" and r[1].endswith("/status")]
    assert not [r for r in new_requests if r[0] == "GET" and "watch=true" not in r[2]
                and r[1] != "/version"], "a converged mirror costs no read either"


def test_spec_changes_update_the_objects_in_place(world: Any, engine: Engine) -> None:
    mirror = put(world, new_mirror("internal", upstream="https://old.example.com",
                                   hostPort=5010))
    mirror_event(world, engine, "internal", "add")
    uids = {k: o["metadata"]["uid"] for k, o in owned_objects(world, "internal").items()}
    mirror["spec"].update(upstream="https://registry.example.com", hostPort=5011, ttl="0")
    put(world, mirror)
    mirror_event(world, engine, "internal")
    objs = owned_objects(world, "internal")
    assert {k: o["metadata"]["uid"] for k, o in objs.items()} == uids
    sts_env = env_of(sts_of(world, "internal"))
    assert sts_env["REGISTRY_PROXY_REMOTEURL"]["value"] == "https://registry.example.com"
    assert sts_env["REGISTRY_STORAGE_DELETE_ENABLED"]["value"] == "false"
    ds = objs[("DaemonSet", "mirror-internal-node")]
    assert ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] == 5011
    assert status_of(world, "internal")["endpoint"] == "localhost:5011"
    assert status_of(world, "internal")["observedGeneration"] == 2


def test_a_spec_change_is_ready_only_once_both_workloads_rolled_it_out(
        world: Any, engine: Engine) -> None:
    """Between the change and the controllers' rollout only old-template pods serve (the
    old port): the mirror says RollingOut, not "served at" the new port."""
    mirror = put(world, new_mirror("internal", upstream="https://old.example.com",
                                   hostPort=5010))
    mirror_event(world, engine, "internal", "add")
    mark_workloads_ready(world, engine, "internal")
    assert condition(world, "internal", "Ready")["reason"] == "Available"
    mirror["spec"].update(upstream="https://registry.example.com", hostPort=5011)
    put(world, mirror)
    mirror_event(world, engine, "internal")
    ready = condition(world, "internal", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RollingOut")
    assert "StatefulSet mirror-internal to observe generation 2" in ready["message"]
    assert "DaemonSet mirror-internal-node to observe generation 2" in ready["message"]
    assert status_of(world, "internal")["observedGeneration"] == 2
    mark_workloads_ready(world, engine, "internal")
    ready = condition(world, "internal", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert "localhost:5011" in ready["message"]


def test_reference_mode_events_reconcile_too(world: Any, engine: Engine) -> None:
    put(world, new_mirror("gcr", upstream="https://gcr.io", hostPort=5003))
    ref = Event(id="1", type=REF_PREFIX + "add", source="test",
                data={"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror", "name": "gcr",
                      "namespace": NS})
    handled(engine, ref)
    assert len(owned_objects(world, "gcr")) == 5
    ds_name = Names.of("gcr").daemonset
    ds_ref = Event(id="2", type=REF_PREFIX + "update", source="test",
                   data={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                         "namespace": NS})
    assert f"{NS}/gcr: " in handled(engine, ds_ref)  # the owner's run


def test_a_workload_deleted_by_hand_is_recreated(world: Any, engine: Engine) -> None:
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    sts = sts_of(world, "quay")
    assert sts is not None
    world.remove("apps/v1", "StatefulSet", sts["metadata"]["name"], NS)
    handled(engine, Event.for_object("delete", sts))
    recreated = sts_of(world, "quay")
    assert recreated is not None and recreated["metadata"]["uid"] != sts["metadata"]["uid"]


def test_events_for_a_mirror_that_is_gone_do_nothing(world: Any, engine: Engine) -> None:
    result = mirror_event(world, engine, "never-existed", "delete")
    assert "gone" in str(result)
    assert owned_objects(world, "never-existed") == {}


def test_workloads_not_owned_by_a_mirror_are_ignored(world: Any, engine: Engine) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "other", "namespace": NS,
                        "labels": {"app.kubernetes.io/managed-by": "eventop"}}}
    assert deliver(engine, Event.for_object("update", sts)) == []


# -- storage ------------------------------------------------------------------------------


def test_a_bigger_size_resizes_the_claim(world: Any, engine: Engine) -> None:
    mirror = put(world, new_mirror("docker-hub", hostPort=5001, storage={"size": "20Gi"}))
    mirror_event(world, engine, "docker-hub", "add")
    mirror["spec"]["storage"]["size"] = "50Gi"
    put(world, mirror)
    mirror_event(world, engine, "docker-hub")
    assert pvc_size(world, "docker-hub") == "50Gi"
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"


@pytest.fixture
def unbound_world() -> Iterator[Any]:
    from eventop.localkube import LocalKube

    server = LocalKube(crd_dir=str(REPO / "crds"), bind_pvcs=False)
    server.start()
    try:
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield server
    finally:
        server.stop()


@pytest.fixture
def unbound_engine(unbound_world: Any) -> Iterator[Engine]:
    kube = Kube.connect(url=unbound_world.url)
    with running_engine(kube, handlers.load("", builtin="mirrors")) as running:
        yield running


def test_a_refused_resize_is_reported_and_the_rest_still_applied(
        unbound_world: Any, unbound_engine: Engine) -> None:
    world, engine = unbound_world, unbound_engine
    mirror = put(world, new_mirror("docker-hub", hostPort=5001, storage={"size": "20Gi"}))
    mirror_event(world, engine, "docker-hub", "add")
    mirror["spec"]["storage"]["size"] = "50Gi"
    mirror["spec"]["upstream"] = "https://mirror.gcr.io"
    put(world, mirror)
    mirror_event(world, engine, "docker-hub")
    assert pvc_size(world, "docker-hub") == "20Gi"
    degraded = condition(world, "docker-hub", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ResizeRefused")
    assert "50Gi" in degraded["message"]
    assert env_of(sts_of(world, "docker-hub"))["REGISTRY_PROXY_REMOTEURL"]["value"] == \
        "https://mirror.gcr.io"
    assert status_of(world, "docker-hub")["observedGeneration"] == 2
    warnings = [e for e in events_about(world, "docker-hub") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ResizeRefused"]


def test_a_smaller_size_keeps_the_claim_and_says_why(world: Any, engine: Engine) -> None:
    mirror = put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002,
                                   storage={"size": "20Gi"}))
    mirror_event(world, engine, "quay", "add")
    mirror["spec"]["storage"]["size"] = "5Gi"
    put(world, mirror)
    mirror_event(world, engine, "quay")
    assert pvc_size(world, "quay") == "20Gi"
    assert condition(world, "quay", "Degraded")["reason"] == "ShrinkRefused"


def test_a_class_for_a_claim_made_without_one_is_refused_by_name_not_by_the_server(
        world: Any, engine: Engine) -> None:
    mirror = put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002,
                                   storage={"size": "20Gi"}))
    mirror_event(world, engine, "quay", "add")
    mirror["spec"]["storage"]["storageClassName"] = "fast"
    mirror["spec"]["upstream"] = "https://quay.example.com"
    put(world, mirror)
    mirror_event(world, engine, "quay")
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "StorageClassImmutable")
    assert "has no storage class" in degraded["message"]
    claim = world.get("v1", "PersistentVolumeClaim", Names.of("quay").pvc, NS)
    assert "storageClassName" not in claim["spec"]
    # the other objects still follow the spec
    assert env_of(sts_of(world, "quay"))["REGISTRY_PROXY_REMOTEURL"]["value"] == \
        "https://quay.example.com"


def test_an_existing_claim_not_made_by_eventop_is_left_alone(world: Any, engine: Engine) -> None:
    theirs = world.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": Names.of("quay").pvc, "namespace": NS},
                        "spec": {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": "1Gi"}}}})
    wait_cached(engine, theirs)  # it exists before the mirror, for the router too
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    pvc = world.get("v1", "PersistentVolumeClaim", Names.of("quay").pvc, NS)
    assert pvc["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert condition(world, "quay", "Degraded")["reason"] == "NameConflict"
    assert sts_of(world, "quay") is None


def test_a_mirror_held_back_by_someones_object_is_made_once_that_object_is_deleted(
        world: Any, engine: Engine) -> None:
    """NameConflict says to remove the object in the way. Its deletion maps to no mirror
    (nobody owns it), so the mirror stayed held back until the router restarted (found on
    a real API server); the engine now runs it again when that object goes."""
    theirs = world.put({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": Names.of("quay").service, "namespace": NS},
                        "spec": {"ports": [{"port": 80}]}})
    wait_cached(engine, theirs)
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    assert condition(world, "quay", "Degraded")["reason"] == "NameConflict"
    world.remove("v1", "Service", theirs["metadata"]["name"], NS)
    assert "quay" in handled(engine, Event.for_object("delete", theirs))
    assert condition(world, "quay", "Degraded")["status"] == "False"
    names = Names.of("quay")
    assert ("Service", names.service) in owned_objects(world, "quay")
    assert sts_of(world, "quay") is not None


# -- conflicts and invalid specs ----------------------------------------------------------------


def test_the_later_mirror_on_a_taken_host_port_creates_nothing_until_it_is_free(
        world: Any, engine: Engine) -> None:
    put(world, new_mirror("docker-hub", hostPort=5001))
    mirror_event(world, engine, "docker-hub", "add")
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5001))
    mirror_event(world, engine, "quay", "add")
    assert owned_objects(world, "quay") == {}
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert "registry-mirrors/docker-hub" in degraded["message"]
    assert condition(world, "quay", "Ready")["status"] == "False"
    assert "endpoint" not in status_of(world, "quay")
    assert [e["reason"] for e in events_about(world, "quay")] == ["HostPortConflict"]
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"
    # the first one goes away: its delete event frees the port for the later one
    world.remove("eventop.dev/v1", "RegistryMirror", "docker-hub", NS)
    seen = len(world.requests)
    mirror_event(world, engine, "docker-hub", "delete")
    mirror_lists = [r for r in world.requests[seen:]
                    if r[0] == "GET" and r[1] == "/apis/eventop.dev/v1/registrymirrors"]
    assert mirror_lists == []  # the held-back mirrors' reconciles read the cache
    assert len(owned_objects(world, "quay")) == 5
    assert condition(world, "quay", "Degraded")["status"] == "False"
    assert status_of(world, "quay")["endpoint"] == "localhost:5001"
    assert "Recovered" in [e["reason"] for e in events_about(world, "quay")]


def test_a_daemonset_orphaned_on_a_host_port_holds_it_until_it_is_deleted(
        world: Any, engine: Engine) -> None:
    """A mirror deleted with --cascade=orphan leaves its node proxies serving the port: the
    next mirror on it was reported Reconciled, its own DaemonSet never able to run a pod (a
    user's trial, on a real API server)."""
    put(world, new_mirror("docker-hub", hostPort=5501))
    mirror_event(world, engine, "docker-hub", "add")
    orphan = world.get("apps/v1", "DaemonSet", Names.of("docker-hub").daemonset, NS)
    orphan["metadata"].pop("ownerReferences")
    orphan = world.put(orphan)  # what the garbage collector does before the deletion
    world.remove("eventop.dev/v1", "RegistryMirror", "docker-hub", NS)
    mirror_event(world, engine, "docker-hub", "delete")
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5501))
    mirror_event(world, engine, "quay", "add")
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert degraded["message"].startswith(
        f"hostPort 5501 is already used by DaemonSet {NS}/{orphan['metadata']['name']}, "
        "which no RegistryMirror owns")
    assert owned_objects(world, "quay") == {}
    # deleting the orphan, as the message says, runs the held-back mirror again
    world.remove("apps/v1", "DaemonSet", orphan["metadata"]["name"], NS)
    handled(engine, Event.for_object("delete", orphan))
    assert condition(world, "quay", "Degraded")["status"] == "False"
    assert ("DaemonSet", Names.of("quay").daemonset) in owned_objects(world, "quay")


def test_an_invalid_upstream_is_a_condition_and_one_warning_not_a_crash(
        world: Any, engine: Engine) -> None:
    stored = put(world, new_mirror("broken", upstream="https://quay.io/some/path",
                                   hostPort=5004))
    for _ in range(3):  # one event delivered three times (at least once): each runs
        result = handled(engine, Event.for_object("add", stored))
        assert "InvalidUpstream" in str(result)
    degraded = condition(world, "broken", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidUpstream")
    assert "path" in degraded["message"]
    (event,) = events_about(world, "broken")
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "InvalidUpstream", 1)
    assert owned_objects(world, "broken") == {}


def test_a_missing_credentials_secret_is_reported_until_it_appears(
        world: Any, engine: Engine) -> None:
    put(world, new_mirror("internal", upstream="https://registry.example.com", hostPort=5010,
                          credentialsSecretRef={"name": "internal-creds"}))
    mirror_event(world, engine, "internal", "add")
    degraded = condition(world, "internal", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CredentialsSecretMissing")
    assert "internal-creds" in degraded["message"]
    assert owned_objects(world, "internal") == {}
    # a Secret without the password key is not enough
    secret = world.put({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "internal-creds", "namespace": NS},
                        "data": {"username": "cm9ib3Q="}})
    handled(engine, Event.for_object("add", secret))
    assert condition(world, "internal", "Degraded")["reason"] == "CredentialsSecretIncomplete"
    secret["data"]["password"] = "c2VjcmV0"
    secret = world.put(secret)
    handled(engine, Event.for_object("update", secret))
    assert condition(world, "internal", "Degraded")["status"] == "False"
    sts = sts_of(world, "internal")
    assert sts is not None
    assert env_of(sts)["REGISTRY_PROXY_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "internal-creds", "key": "password"}
    assert sts["spec"]["template"]["metadata"]["annotations"][
        "eventop.dev/credentials-version"] == credentials_digest(secret)
    reasons = [(e["type"], e["reason"]) for e in events_about(world, "internal")]
    assert ("Warning", "CredentialsSecretMissing") in reasons
    assert ("Warning", "CredentialsSecretIncomplete") in reasons
    assert ("Normal", "Recovered") in reasons


def test_a_workload_deleted_in_reference_mode_is_found_by_its_name(
        world: Any, engine: Engine) -> None:
    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    ds_name = Names.of("quay").daemonset
    old_uid = world.get("apps/v1", "DaemonSet", ds_name, NS)["metadata"]["uid"]
    world.remove("apps/v1", "DaemonSet", ds_name, NS)
    handled(engine, Event(id="3", type=REF_PREFIX + "delete", source="test",
                          data={"apiVersion": "apps/v1", "kind": "DaemonSet",
                                "name": ds_name, "namespace": NS}))
    recreated = world.get("apps/v1", "DaemonSet", ds_name, NS)
    assert recreated is not None and recreated["metadata"]["uid"] != old_uid


def test_a_reference_mode_delete_waits_for_the_cache_to_see_the_workload_gone(
        world: Any, engine: Engine) -> None:
    """A Reference-mode event has no labels, and DaemonSets are cached by label: the event
    was not held for the cache to see the deletion, and its run read the DaemonSet the cache
    still held, making nothing (the test above failed now and then, in CI under load)."""
    import threading

    put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002))
    mirror_event(world, engine, "quay", "add")
    ds_name = Names.of("quay").daemonset
    old_uid = world.get("apps/v1", "DaemonSet", ds_name, NS)["metadata"]["uid"]
    world.hang_watches(True)  # the cache does not learn of the deletion yet
    try:
        world.remove("apps/v1", "DaemonSet", ds_name, NS)
        answer = threading.Thread(target=handled, args=(engine, Event(
            id="3", type=REF_PREFIX + "delete", source="test",
            data={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                  "namespace": NS})))
        answer.start()
        answer.join(1.0)
        answered_before_the_cache_saw_it = not answer.is_alive()
    finally:
        world.hang_watches(False)
    answer.join(20)
    assert not answered_before_the_cache_saw_it
    recreated = world.get("apps/v1", "DaemonSet", ds_name, NS)
    assert recreated is not None and recreated["metadata"]["uid"] != old_uid


def test_secrets_no_mirror_names_cause_no_reconcile(world: Any, engine: Engine) -> None:
    put(world, new_mirror("internal", upstream="https://registry.example.com", hostPort=5010,
                          credentialsSecretRef={"name": "internal-creds"}))
    other = world.put({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "unrelated", "namespace": NS},
                       "stringData": {"username": "u", "password": "p"}})
    assert deliver(engine, Event.for_object("add", other)) == []
    assert status_of(world, "internal") == {}


def test_the_refused_resize_message_is_the_servers_first_line(
        unbound_world: Any, unbound_engine: Engine) -> None:
    world, engine = unbound_world, unbound_engine
    mirror = put(world, new_mirror("quay", upstream="https://quay.io", hostPort=5002,
                                   storage={"size": "1Gi"}))
    mirror_event(world, engine, "quay", "add")
    mirror["spec"]["storage"]["size"] = "2Gi"
    put(world, mirror)
    mirror_event(world, engine, "quay")
    message = condition(world, "quay", "Degraded")["message"]
    assert "422 Invalid" in message
    assert "spec is immutable after creation except resources.requests" in message
    assert "\n" not in message
