"""The RegistryMirror controller on the engine's in-memory World: which objects a mirror gets,
what its status says, and which changes reconcile it (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine.testing import World
from eventop.handlers.mirrors import mirrors
from eventop.handlers.mirrors.build import Names
from tests.mirrors.support import (
    env_of,
    rolled_out_daemonset_status,
    rolled_out_statefulset_status,
)

Obj = dict[str, Any]
NS = "registry-mirrors"
MIRROR = "eventop.dev/v1/RegistryMirror"
OWNED = ("v1/PersistentVolumeClaim", "v1/Service", "apps/v1/StatefulSet", "apps/v1/DaemonSet")


def new_mirror(name: str, created: str = "2026-11-21T07:00:00Z", generation: int = 1,
               **spec: Any) -> Obj:
    spec.setdefault("upstream", "https://registry-1.docker.io")
    return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": name, "namespace": NS, "generation": generation,
                         "creationTimestamp": created}, "spec": spec}


def changed_spec(world: World, name: str, **changes: Any) -> Obj:
    """The mirror with its spec changed, as the API server stores it (next generation)."""
    current = world.get(MIRROR, name, NS)
    meta = {**current["metadata"], "generation": current["metadata"]["generation"] + 1}
    return world.put({**current, "metadata": meta, "spec": {**current["spec"], **changes}})


def owned(world: World, name: str) -> dict[tuple[str, str], Obj]:
    uid = world.get(MIRROR, name, NS)["metadata"]["uid"]
    return {(o["kind"], o["metadata"]["name"]): o for kind in OWNED
            for o in world.list(kind, NS, owner=uid)}


def status(world: World, name: str) -> Obj:
    found: Obj = world.get(MIRROR, name, NS).get("status") or {}
    return found


def condition(world: World, name: str, type_: str) -> Obj:
    return next(c for c in status(world, name)["conditions"] if c["type"] == type_)


def events(world: World, name: str) -> list[tuple[str, str]]:
    return [(n.type, n.reason) for who, n in world.events if who == name]


def mark_workloads_ready(world: World, name: str, nodes: int = 2) -> None:
    """Play the StatefulSet and DaemonSet controllers and hand their changes to mirrors."""
    names = Names.of(name)
    sts = world.get("apps/v1/StatefulSet", names.statefulset, NS)
    world.changed(mirrors, world.put({**sts, "status": rolled_out_statefulset_status(sts)}))
    ds = world.get("apps/v1/DaemonSet", names.daemonset, NS)
    world.changed(mirrors, world.put({**ds, "status": rolled_out_daemonset_status(ds, nodes)}))


# -- creation, status, updates ------------------------------------------------------------


def test_a_new_mirror_gets_its_five_owned_objects_and_a_status() -> None:
    world = World([new_mirror("docker-hub", hostPort=5001, storage={"size": "20Gi"})])
    world.converge(mirrors)
    assert sorted(owned(world, "docker-hub")) == [
        ("DaemonSet", "mirror-docker-hub-node"),
        ("PersistentVolumeClaim", "mirror-docker-hub-cache"),
        ("Service", "mirror-docker-hub"), ("Service", "mirror-docker-hub-hl"),
        ("StatefulSet", "mirror-docker-hub")]
    assert world.writes[-1] == ("status", "RegistryMirror", NS, "docker-hub")
    assert [w[0] for w in world.writes] == ["create"] * 5 + ["status"]
    got = status(world, "docker-hub")
    assert got["endpoint"] == "localhost:5001"
    assert got["serviceURL"] == "http://mirror-docker-hub.registry-mirrors.svc.cluster.local:5000"
    assert got["observedGeneration"] == 1
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"
    ready = condition(world, "docker-hub", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RegistryNotReady")


def test_ready_follows_the_workloads_own_status_without_writing_them() -> None:
    world = World([new_mirror("quay", upstream="https://quay.io", hostPort=5002)])
    world.converge(mirrors)
    mark_workloads_ready(world, "quay", nodes=3)
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert "3 node(s)" in ready["message"]
    ds = world.get("apps/v1/DaemonSet", Names.of("quay").daemonset, NS)
    world.changed(mirrors, world.put({**ds, "status": {**ds["status"], "numberReady": 2}}))
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NodeProxyNotReady")
    assert {w[0] for w in world.writes[6:]} == {"status"}, "workloads are never rewritten"


def test_a_second_reconcile_writes_nothing() -> None:
    world = World([new_mirror("docker-hub", hostPort=5001)])
    world.converge(mirrors)
    mark_workloads_ready(world, "docker-hub")
    before = len(world.writes)
    world.reconcile(mirrors, "docker-hub", NS)
    assert len(world.writes) == before


def test_spec_changes_update_the_objects_in_place() -> None:
    world = World([new_mirror("internal", upstream="https://old.example.com", hostPort=5010)])
    world.converge(mirrors)
    uids = {k: o["metadata"]["uid"] for k, o in owned(world, "internal").items()}
    world.changed(mirrors, changed_spec(world, "internal", upstream="https://registry.example.com",
                                        hostPort=5011, ttl="0"))
    objs = owned(world, "internal")
    assert {k: o["metadata"]["uid"] for k, o in objs.items()} == uids
    sts_env = env_of(objs[("StatefulSet", "mirror-internal")])
    assert sts_env["REGISTRY_PROXY_REMOTEURL"]["value"] == "https://registry.example.com"
    assert sts_env["REGISTRY_STORAGE_DELETE_ENABLED"]["value"] == "false"
    ds = objs[("DaemonSet", "mirror-internal-node")]
    assert ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] == 5011
    assert status(world, "internal")["endpoint"] == "localhost:5011"
    assert status(world, "internal")["observedGeneration"] == 2


def test_a_workload_deleted_by_hand_is_created_again() -> None:
    world = World([new_mirror("quay", upstream="https://quay.io", hostPort=5002)])
    world.converge(mirrors)
    sts = world.get("apps/v1/StatefulSet", Names.of("quay").statefulset, NS)
    world.delete("apps/v1/StatefulSet", sts["metadata"]["name"], NS)
    assert [str(r.key) for r in world.changed(mirrors, sts)] == [f"{NS}/quay"]
    again = world.get("apps/v1/StatefulSet", Names.of("quay").statefulset, NS)
    assert again is not None and again["metadata"]["uid"] != sts["metadata"]["uid"]


def test_workloads_not_owned_by_a_mirror_start_no_run() -> None:
    world = World([new_mirror("quay", hostPort=5002)])
    other = world.put({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
        "name": "other", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "eventop"}}})
    assert world.changed(mirrors, other) == []


def test_a_deleted_mirror_needs_no_run_its_objects_go_with_it() -> None:
    world = World([new_mirror("gcr", upstream="https://gcr.io", hostPort=5003)])
    world.converge(mirrors)
    last = world.get(MIRROR, "gcr", NS)
    world.delete(MIRROR, "gcr", NS)
    before = len(world.writes)
    (run,) = world.changed(mirrors, last)
    assert "gone" in run.summary and len(world.writes) == before
    assert all(world.list(kind, NS) == [] for kind in OWNED)


# -- storage ------------------------------------------------------------------------------


def pvc_size(world: World, name: str) -> str:
    pvc = world.get("v1/PersistentVolumeClaim", Names.of(name).pvc, NS)
    return str(pvc["spec"]["resources"]["requests"]["storage"])


def test_a_bigger_size_resizes_the_claim() -> None:
    world = World([new_mirror("docker-hub", hostPort=5001, storage={"size": "20Gi"})])
    world.converge(mirrors)
    world.changed(mirrors, changed_spec(world, "docker-hub", storage={"size": "50Gi"}))
    assert pvc_size(world, "docker-hub") == "50Gi"
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"


def test_a_smaller_size_keeps_the_claim_and_says_why() -> None:
    world = World([new_mirror("quay", hostPort=5002, storage={"size": "20Gi"})])
    world.converge(mirrors)
    world.changed(mirrors, changed_spec(world, "quay", storage={"size": "5Gi"}))
    assert pvc_size(world, "quay") == "20Gi"
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ShrinkRefused")
    assert events(world, "quay") == [("Warning", "ShrinkRefused")]


def test_an_existing_claim_not_made_by_eventop_blocks_the_mirror_untouched() -> None:
    theirs = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
              "metadata": {"name": Names.of("quay").pvc, "namespace": NS},
              "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    world = World([theirs, new_mirror("quay", hostPort=5002)])
    rv = world.get("v1/PersistentVolumeClaim", Names.of("quay").pvc, NS)["metadata"][
        "resourceVersion"]
    world.converge(mirrors)
    pvc = world.get("v1/PersistentVolumeClaim", Names.of("quay").pvc, NS)
    assert pvc["metadata"]["resourceVersion"] == rv
    assert condition(world, "quay", "Degraded")["reason"] == "NameConflict"
    assert world.list("apps/v1/StatefulSet", NS) == []


def test_objects_an_earlier_mirror_of_the_name_left_are_taken_over() -> None:
    world = World([new_mirror("quay", hostPort=5002)])
    world.converge(mirrors)
    earlier = world.get(MIRROR, "quay", NS)
    svc = world.get("v1/Service", Names.of("quay").service, NS)
    # deleted and created again before the garbage collector ran: the Service remains
    world.delete(MIRROR, "quay", NS)
    world.put(svc)
    world.put(new_mirror("quay", hostPort=5002))
    world.converge(mirrors)
    taken = world.get("v1/Service", Names.of("quay").service, NS)
    uid = world.get(MIRROR, "quay", NS)["metadata"]["uid"]
    assert uid != earlier["metadata"]["uid"]
    assert uid in [r["uid"] for r in taken["metadata"]["ownerReferences"]]
    assert condition(world, "quay", "Degraded")["status"] == "False"


# -- conflicts and invalid specs ------------------------------------------------------------


def test_the_later_mirror_on_a_taken_host_port_waits_until_it_is_free() -> None:
    world = World([new_mirror("docker-hub", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("quay", "2026-11-21T07:30:00Z", upstream="https://quay.io",
                              hostPort=5001)])
    world.converge(mirrors)
    assert owned(world, "quay") == {}
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert "registry-mirrors/docker-hub" in degraded["message"]
    assert condition(world, "quay", "Ready")["status"] == "False"
    assert status(world, "quay")["endpoint"] is None
    assert events(world, "quay") == [("Warning", "HostPortConflict")]
    assert condition(world, "docker-hub", "Degraded")["status"] == "False"
    # the first one goes away: its change reconciles the mirror it held back
    last = world.get(MIRROR, "docker-hub", NS)
    world.delete(MIRROR, "docker-hub", NS)
    assert {str(r.key) for r in world.changed(mirrors, last)} == {
        f"{NS}/docker-hub", f"{NS}/quay"}
    assert len(owned(world, "quay")) == 5
    assert condition(world, "quay", "Degraded")["status"] == "False"
    assert status(world, "quay")["endpoint"] == "localhost:5001"
    assert events(world, "quay") == [("Warning", "HostPortConflict"), ("Normal", "Recovered")]


def test_a_mirror_moving_off_a_port_frees_it_for_the_one_held_back() -> None:
    world = World([new_mirror("a", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("b", "2026-11-21T07:30:00Z", hostPort=5001)])
    world.converge(mirrors)
    assert owned(world, "b") == {}
    world.changed(mirrors, changed_spec(world, "a", hostPort=5002))
    assert len(owned(world, "b")) == 5
    assert status(world, "a")["endpoint"] == "localhost:5002"


def test_a_mirror_moving_onto_a_taken_port_keeps_serving_its_old_one_and_says_so() -> None:
    world = World([new_mirror("a", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("b", "2026-11-21T07:30:00Z", hostPort=5002)])
    world.converge(mirrors)
    before = {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "b").items()}
    world.changed(mirrors, changed_spec(world, "b", hostPort=5001))
    assert {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "b").items()} == \
        before
    degraded = condition(world, "b", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert "objects were neither created nor changed" in degraded["message"]
    assert status(world, "b")["endpoint"] == "localhost:5002"  # what still serves


def test_a_mirror_moving_onto_a_port_a_newer_mirror_serves_is_the_one_held_back() -> None:
    """The newer mirror's node proxies already serve the port: it keeps the port, even
    though the mirror moving onto it was created earlier, and is not blamed afterwards."""
    world = World([new_mirror("docker-hub", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("gcr", "2026-11-21T07:30:00Z", upstream="https://gcr.io",
                              hostPort=5003)])
    world.converge(mirrors)
    world.changed(mirrors, changed_spec(world, "gcr", hostPort=5004))
    assert status(world, "gcr")["endpoint"] == "localhost:5004"
    world.changed(mirrors, changed_spec(world, "docker-hub", hostPort=5004))
    degraded = condition(world, "docker-hub", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPortConflict")
    assert "registry-mirrors/gcr, which holds it" in degraded["message"]
    assert status(world, "docker-hub")["endpoint"] == "localhost:5001"  # still serving
    assert condition(world, "docker-hub", "Ready")["reason"] != "Available"
    world.converge(mirrors)  # gcr runs again (a resync, any event): still its port
    assert condition(world, "gcr", "Degraded")["status"] == "False"
    assert status(world, "gcr")["endpoint"] == "localhost:5004"
    assert status(world, "docker-hub")["endpoint"] == "localhost:5001"


def test_an_invalid_upstream_is_a_condition_and_one_warning_not_a_crash() -> None:
    world = World([new_mirror("broken", upstream="https://quay.io/some/path", hostPort=5004)])
    for _ in range(3):
        (run,) = world.changed(mirrors, world.get(MIRROR, "broken", NS))
        assert "InvalidUpstream" in run.summary
    degraded = condition(world, "broken", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidUpstream")
    assert "path" in degraded["message"]
    ready = condition(world, "broken", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidUpstream")
    assert events(world, "broken") == [("Warning", "InvalidUpstream")]
    assert all(world.list(kind, NS) == [] for kind in OWNED)


def test_a_spec_broken_after_creation_keeps_the_objects_and_recovers_when_fixed() -> None:
    world = World([new_mirror("quay", upstream="https://quay.io", hostPort=5002)])
    world.converge(mirrors)
    before = {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "quay").items()}
    world.changed(mirrors, changed_spec(world, "quay", ttl="7d"))
    assert {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "quay").items()} == \
        before
    assert condition(world, "quay", "Degraded")["reason"] == "InvalidTTL"
    assert status(world, "quay")["observedGeneration"] == 2
    world.changed(mirrors, changed_spec(world, "quay", ttl="24h"))
    assert condition(world, "quay", "Degraded")["status"] == "False"
    assert env_of(owned(world, "quay")[("StatefulSet", "mirror-quay")])["REGISTRY_PROXY_TTL"][
        "value"] == "24h"
    assert events(world, "quay") == [("Warning", "InvalidTTL"), ("Normal", "Recovered")]


def test_a_missing_credentials_secret_is_reported_until_it_appears() -> None:
    world = World([new_mirror("internal", upstream="https://registry.example.com",
                              hostPort=5010, credentialsSecretRef={"name": "internal-creds"})])
    world.converge(mirrors)
    degraded = condition(world, "internal", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CredentialsSecretMissing")
    assert "internal-creds" in degraded["message"]
    assert owned(world, "internal") == {}
    secret = world.put({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "internal-creds", "namespace": NS},
                        "data": {"username": "cm9ib3Q="}})
    assert [str(r.key) for r in world.changed(mirrors, secret)] == [f"{NS}/internal"]
    assert condition(world, "internal", "Degraded")["reason"] == "CredentialsSecretIncomplete"
    secret = world.put({**secret, "data": {**secret["data"], "password": "c2VjcmV0"}})
    world.changed(mirrors, secret)
    assert condition(world, "internal", "Degraded")["status"] == "False"
    sts = owned(world, "internal")[("StatefulSet", "mirror-internal")]
    assert env_of(sts)["REGISTRY_PROXY_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "internal-creds", "key": "password"}
    assert sts["spec"]["template"]["metadata"]["annotations"][
        "eventop.dev/credentials-version"]
    assert events(world, "internal") == [
        ("Warning", "CredentialsSecretMissing"), ("Warning", "CredentialsSecretIncomplete"),
        ("Normal", "Recovered")]


def test_rotated_credentials_roll_the_registry_pod() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "creds", "namespace": NS},
              "stringData": {"username": "u", "password": "p"}}
    world = World([secret, new_mirror("internal", hostPort=5010,
                                      credentialsSecretRef={"name": "creds"})])
    world.converge(mirrors)
    before = credentials_version(world)
    rotated = world.put({**world.get("v1/Secret", "creds", NS),
                         "stringData": {"username": "u", "password": "new"}})
    world.changed(mirrors, rotated)
    assert credentials_version(world) not in (before, None)


def test_a_label_on_the_credentials_secret_does_not_restart_the_registry() -> None:
    """Only the username and password reach the registry: a write that changes neither
    (a label, an annotation, another key) bumps the Secret's resourceVersion only."""
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "creds", "namespace": NS},
              "data": {"username": "dQ==", "password": "cA=="}}
    world = World([secret, new_mirror("internal", hostPort=5010,
                                      credentialsSecretRef={"name": "creds"})])
    world.converge(mirrors)
    before = credentials_version(world)
    sts_rv = owned(world, "internal")[("StatefulSet", "mirror-internal")]["metadata"][
        "resourceVersion"]
    current = world.get("v1/Secret", "creds", NS)
    labelled = world.put({**current, "metadata": {**current["metadata"],
                                                  "labels": {"team": "infra"}},
                          "data": {**current["data"], "note": "eA=="}})
    assert labelled["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]
    world.changed(mirrors, labelled)
    assert credentials_version(world) == before
    assert owned(world, "internal")[("StatefulSet", "mirror-internal")]["metadata"][
        "resourceVersion"] == sts_rv


def credentials_version(world: World, name: str = "internal") -> str | None:
    """The registry pod template's credentials annotation."""
    sts = owned(world, name)[("StatefulSet", Names.of(name).statefulset)]
    found: str | None = sts["spec"]["template"]["metadata"]["annotations"].get(
        "eventop.dev/credentials-version")
    return found


def test_secrets_no_mirror_names_start_no_run() -> None:
    world = World([new_mirror("internal", hostPort=5010,
                              credentialsSecretRef={"name": "internal-creds"})])
    other = world.put({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "unrelated", "namespace": NS},
                       "stringData": {"username": "u", "password": "p"}})
    assert world.changed(mirrors, other) == []
    assert status(world, "internal") == {}


def test_a_workload_gone_as_a_bare_reference_is_found_by_its_name() -> None:
    world = World([new_mirror("quay", hostPort=5002)])
    world.converge(mirrors)
    ds_name = Names.of("quay").daemonset
    world.delete("apps/v1/DaemonSet", ds_name, NS)
    reference = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                 "metadata": {"name": ds_name, "namespace": NS}}
    assert [str(r.key) for r in world.changed(mirrors, reference)] == [f"{NS}/quay"]
    assert world.get("apps/v1/DaemonSet", ds_name, NS) is not None


# -- holding a hostPort -------------------------------------------------------------------


def daemonsets_on(world: World, port: int) -> list[str]:
    """The names of the DaemonSets whose node proxies use ``port``."""
    return [ds["metadata"]["name"] for ds in world.list("apps/v1/DaemonSet", NS)
            if ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] == port]


def test_a_mirror_whose_daemonset_is_deleted_by_hand_keeps_its_port_and_gets_it_back() -> None:
    """The user's trial: older b1 moves onto the port newer w1 serves (b1 is held back),
    then w1's DaemonSet is deleted by hand. w1 still holds the port (its status says so):
    its DaemonSet is created again on it, and b1 goes on being held back."""
    world = World([new_mirror("b1", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("w1", "2026-11-21T07:30:00Z", hostPort=5003)])
    world.converge(mirrors)
    assert status(world, "w1")["hostPort"] == 5003
    world.changed(mirrors, changed_spec(world, "b1", hostPort=5003))
    assert condition(world, "b1", "Degraded")["reason"] == "HostPortConflict"
    assert status(world, "b1")["hostPort"] == 5001  # its old DaemonSet still serves that
    ds = world.get("apps/v1/DaemonSet", Names.of("w1").daemonset, NS)
    world.delete("apps/v1/DaemonSet", ds["metadata"]["name"], NS)
    world.changed(mirrors, {"apiVersion": "apps/v1", "kind": "DaemonSet",
                            "metadata": {"name": ds["metadata"]["name"], "namespace": NS}})
    world.converge(mirrors)
    assert daemonsets_on(world, 5003) == [Names.of("w1").daemonset]
    again = world.get("apps/v1/DaemonSet", Names.of("w1").daemonset, NS)
    assert again["metadata"]["uid"] != ds["metadata"]["uid"]
    assert condition(world, "w1", "Degraded")["status"] == "False"
    b1 = condition(world, "b1", "Degraded")
    assert (b1["reason"], "registry-mirrors/w1, which holds it" in b1["message"]) == (
        "HostPortConflict", True)
    assert daemonsets_on(world, 5001) == [Names.of("b1").daemonset]


def test_deleting_the_holding_mirror_frees_its_recorded_port_for_the_next() -> None:
    world = World([new_mirror("b1", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("w1", "2026-11-21T07:30:00Z", hostPort=5003)])
    world.converge(mirrors)
    world.changed(mirrors, changed_spec(world, "b1", hostPort=5003))
    last = world.get(MIRROR, "w1", NS)
    world.delete(MIRROR, "w1", NS)
    world.changed(mirrors, last)
    assert daemonsets_on(world, 5003) == [Names.of("b1").daemonset]
    assert status(world, "b1")["hostPort"] == 5003
    assert condition(world, "b1", "Degraded")["status"] == "False"


def test_two_mirrors_created_at_once_on_one_port_end_with_one_daemonset() -> None:
    world = World([new_mirror("a", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("b", "2026-11-21T07:00:00Z", hostPort=5001)])
    world.converge(mirrors)
    world.converge(mirrors)
    assert daemonsets_on(world, 5001) == [Names.of("a").daemonset]
    assert status(world, "b").get("hostPort") is None


def test_a_mirror_with_an_invalid_spec_does_not_keep_a_valid_one_off_its_port() -> None:
    world = World([new_mirror("inv1", "2026-11-21T07:00:00Z", upstream="https://quay.io/a/b",
                              hostPort=5005),
                   new_mirror("ok", "2026-11-21T07:30:00Z", hostPort=5005)])
    world.converge(mirrors)
    assert condition(world, "inv1", "Degraded")["reason"] == "InvalidUpstream"
    assert condition(world, "ok", "Degraded")["status"] == "False"
    assert daemonsets_on(world, 5005) == [Names.of("ok").daemonset]


def test_a_mirror_whose_spec_turns_invalid_keeps_the_port_its_objects_serve() -> None:
    world = World([new_mirror("a", "2026-11-21T07:00:00Z", hostPort=5005)])
    world.converge(mirrors)
    world.changed(mirrors, changed_spec(world, "a", ttl="7d"))
    world.put(new_mirror("b", "2026-11-21T08:00:00Z", hostPort=5005))
    world.converge(mirrors)
    assert condition(world, "b", "Degraded")["reason"] == "HostPortConflict"
    assert daemonsets_on(world, 5005) == [Names.of("a").daemonset]


# -- Ready while a new generation is held back ----------------------------------------------


def test_ready_is_false_while_a_new_spec_waits_for_its_credentials_secret() -> None:
    world = World([new_mirror("quay", upstream="https://quay.io", hostPort=5002)])
    world.converge(mirrors)
    mark_workloads_ready(world, "quay")
    assert condition(world, "quay", "Ready")["status"] == "True"
    world.changed(mirrors, changed_spec(world, "quay", upstream="https://mirror.gcr.io",
                                        credentialsSecretRef={"name": "gcr-creds"}))
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "CredentialsSecretMissing")
    assert ready["observedGeneration"] == 2
    assert "generation 2 is held back" in ready["message"]
    assert "previous spec keep serving at localhost:5002" in ready["message"]


def test_ready_is_false_while_a_new_spec_waits_for_a_taken_host_port() -> None:
    world = World([new_mirror("a", "2026-11-21T07:00:00Z", hostPort=5001),
                   new_mirror("b", "2026-11-21T07:30:00Z", hostPort=5002)])
    world.converge(mirrors)
    mark_workloads_ready(world, "b")
    world.changed(mirrors, changed_spec(world, "b", upstream="https://quay.io", hostPort=5001))
    ready = condition(world, "b", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "HostPortConflict")
    assert "keep serving at localhost:5002" in ready["message"]


# -- Pod Security --------------------------------------------------------------------------


def labelled_namespace(level: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"pod-security.kubernetes.io/enforce": level}}}


def refused_daemonset_status(ds: Obj, nodes: int) -> Obj:
    """What the DaemonSet controller reports while admission refuses every pod it creates:
    its nodes counted, no pod on any of them."""
    return {"observedGeneration": ds["metadata"].get("generation", 1),
            "desiredNumberScheduled": nodes, "currentNumberScheduled": 0,
            "numberMisscheduled": 0, "numberReady": 0, "numberUnavailable": nodes}


def run_registry_only(world: World, name: str, scheduled: bool = True) -> None:
    """Play the controllers of a namespace refusing the node proxies: the registry runs;
    the DaemonSet is scheduled on two nodes with no pod (or not scheduled yet)."""
    names = Names.of(name)
    sts = world.get("apps/v1/StatefulSet", names.statefulset, NS)
    world.changed(mirrors, world.put({**sts, "status": rolled_out_statefulset_status(sts)}))
    if scheduled:
        ds = world.get("apps/v1/DaemonSet", names.daemonset, NS)
        world.changed(mirrors, world.put({**ds, "status": refused_daemonset_status(ds, 2)}))


@pytest.mark.parametrize("scheduled", [False, True], ids=["not-scheduled", "no-pod-admitted"])
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_node_proxies_that_do_not_run_in_a_namespace_refusing_host_ports_are_explained(
        level: str, scheduled: bool) -> None:
    world = World([labelled_namespace(level), new_mirror("quay", hostPort=5002)])
    world.converge(mirrors)
    assert len(owned(world, "quay")) == 5  # applied: relabelling the namespace is enough
    run_registry_only(world, "quay", scheduled)
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodSecurityForbidsHostPort")
    assert level in ready["message"] and "privileged" in ready["message"]
    assert condition(world, "quay", "Degraded")["status"] == "False"  # the label alone is no fault


def test_relabelling_the_namespace_privileged_clears_the_pod_security_explanation() -> None:
    world = World([labelled_namespace("baseline"), new_mirror("quay", hostPort=5002)])
    world.converge(mirrors)
    run_registry_only(world, "quay")
    assert condition(world, "quay", "Ready")["reason"] == "PodSecurityForbidsHostPort"
    relabelled = world.put(labelled_namespace("privileged"))
    assert [str(r.key) for r in world.changed(mirrors, relabelled)] == [f"{NS}/quay"]
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RollingOut")
    assert "Pod Security" not in ready["message"]


def test_node_proxies_running_in_a_restricted_namespace_say_nothing_of_pod_security() -> None:
    """An exempted namespace (or an admission policy that lets the pods in) runs the node
    proxies despite the label: the mirror is Ready and not Degraded."""
    world = World([labelled_namespace("restricted"), new_mirror("quay", hostPort=5002)])
    world.converge(mirrors)
    mark_workloads_ready(world, "quay")
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    degraded = condition(world, "quay", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "Reconciled")
    assert not any("PodSecurity" in str(c) for c in status(world, "quay")["conditions"])
    assert ("Warning", "PodSecurityForbidsHostPort") not in events(world, "quay")


# -- images ------------------------------------------------------------------------------


def test_a_whitespace_padded_image_touches_nothing_and_is_reported() -> None:
    world = World([new_mirror("quay", upstream="https://quay.io", hostPort=5002)])
    world.converge(mirrors)
    before = {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "quay").items()}
    world.changed(mirrors, changed_spec(world, "quay",
                                        image={"registry": "docker.io/library/registry:3.0.0 "}))
    assert {k: o["metadata"]["resourceVersion"] for k, o in owned(world, "quay").items()} == \
        before
    ready = condition(world, "quay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidImage")
