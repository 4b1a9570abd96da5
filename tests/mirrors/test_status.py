"""Pure decisions of the reconcile: readiness, hostPort claims, PVC sizing, foreign objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eventop.engine import Outcome, WriteError
from eventop.engine.write import one_line
from eventop.handlers.mirrors import build
from eventop.handlers.mirrors.desired import (
    credentials_digest,
    foreign_objects,
    host_port_conflict,
    in_the_way,
    plan_pvc,
    port_holders,
    write_problems,
)
from eventop.handlers.mirrors.spec import parse_spec
from eventop.handlers.mirrors.status import Problem, compute_status, transition_notes
from eventop.kube.objects import status_changed
from tests.mirrors.support import rolled_out_daemonset_status, rolled_out_statefulset_status

Obj = dict[str, Any]
NOW = "2026-11-21T08:00:00Z"
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "errors"


def mirror(name: str = "docker-hub", created: str = "2026-11-21T07:42:44Z", *,
           namespace: str = "registry-mirrors", uid: str | None = None, **spec: Any) -> Obj:
    spec.setdefault("upstream", "https://registry-1.docker.io")
    return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": name, "namespace": namespace, "generation": 3,
                         "uid": uid or f"uid-{namespace}-{name}", "creationTimestamp": created},
            "spec": spec}


def workloads(m: Obj, *, ready_replicas: int = 1, desired: int | None = 3,
              ready: int = 3) -> tuple[Obj, Obj]:
    sts = build.statefulset(m, parse_spec(m))
    sts["metadata"]["generation"] = 1
    sts["status"] = rolled_out_statefulset_status(sts, ready=ready_replicas)
    ds = build.daemonset(m, parse_spec(m))
    ds["metadata"]["generation"] = 1
    ds["status"] = {} if desired is None else rolled_out_daemonset_status(ds, desired, ready)
    return sts, ds


def cond(status: Obj, type_: str) -> Obj:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_ready_when_registry_and_every_node_proxy_are_ready() -> None:
    m = mirror(hostPort=5001)
    sts, ds = workloads(m)
    status = compute_status(m, sts, ds, problems=[], now=NOW)
    assert cond(status, "Ready")["status"] == "True"
    assert cond(status, "Degraded")["status"] == "False"
    assert status["observedGeneration"] == 3
    assert cond(status, "Degraded")["observedGeneration"] == 3
    assert status["endpoint"] == "localhost:5001"
    assert status["serviceURL"] == \
        "http://mirror-docker-hub.registry-mirrors.svc.cluster.local:5000"


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"ready_replicas": 0}, "RegistryNotReady"),
    ({"desired": 3, "ready": 2}, "NodeProxyNotReady"),
    ({"desired": 0, "ready": 0}, "NoNodes"),
    ({"desired": None}, "NodeProxyPending"),
])
def test_not_ready_says_which_part_is_missing(kwargs: Obj, reason: str) -> None:
    m = mirror()
    sts, ds = workloads(m, **kwargs)
    ready = cond(compute_status(m, sts, ds, problems=[], now=NOW), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)


def rolling(m: Obj, part: str) -> tuple[Obj, Obj]:
    """Ready workloads, then ``part`` of a spec change in flight, as the controllers report
    it while only old-template pods serve (their counts still say ready)."""
    sts, ds = workloads(m)
    if part == "statefulset spec not observed":
        sts["metadata"]["generation"] = 2
    elif part == "registry pod not updated":
        sts["metadata"]["generation"] = sts["status"]["observedGeneration"] = 2
        sts["status"]["updateRevision"] = "mirror-rev-2"
        del sts["status"]["updatedReplicas"]  # the API server omits a zero count
    elif part == "statefulset revision not current":
        sts["status"].update(updateRevision="mirror-rev-2")
    elif part == "daemonset spec not observed":
        ds["metadata"]["generation"] = 2
    elif part == "node proxies not updated":
        ds["metadata"]["generation"] = ds["status"]["observedGeneration"] = 2
        ds["status"]["updatedNumberScheduled"] = 1
    return sts, ds


@pytest.mark.parametrize(("part", "waits_for"), [
    ("statefulset spec not observed", "StatefulSet mirror-docker-hub to observe generation 2"),
    ("registry pod not updated", "StatefulSet mirror-docker-hub: 0 of 1 registry pod(s) updated"),
    ("statefulset revision not current", "to finish its update to revision mirror-rev-2"),
    ("daemonset spec not observed", "DaemonSet mirror-docker-hub-node to observe generation 2"),
    ("node proxies not updated", "DaemonSet mirror-docker-hub-node: 1 of 3 node proxies updated"),
])
def test_a_rollout_in_progress_is_not_ready_for_the_new_spec(part: str, waits_for: str) -> None:
    """Old-template pods still serve (the old upstream, the old hostPort): what the spec now
    asks for is not served yet, whatever the ready counts say."""
    m = mirror(hostPort=5004)
    sts, ds = rolling(m, part)
    status = compute_status(m, sts, ds, problems=[], now=NOW)
    ready = cond(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RollingOut")
    assert waits_for in ready["message"] and "localhost:5004" in ready["message"]
    assert "served at" not in ready["message"]


def test_node_proxies_not_available_yet_are_not_ready() -> None:
    """numberAvailable (omitted by the API server when zero) is what kubectl waits for."""
    m = mirror()
    sts, ds = workloads(m)
    del ds["status"]["numberAvailable"]
    ready = cond(compute_status(m, sts, ds, problems=[], now=NOW), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NodeProxyNotReady")


def test_a_blocked_new_mirror_reports_the_block_in_both_conditions_and_no_endpoint() -> None:
    m = mirror()
    problem = Problem("HostPortConflict", "hostPort 5000 is already used by ...")
    status = compute_status(m, None, None, problems=[problem], now=NOW)
    assert cond(status, "Degraded")["reason"] == "HostPortConflict"
    assert cond(status, "Ready")["reason"] == "HostPortConflict"
    assert cond(status, "Ready")["status"] == "False"
    assert status["endpoint"] is None and status["serviceURL"] is None


def test_workloads_becoming_ready_move_ready_and_leave_degraded_as_it_was() -> None:
    """A workload's status change runs the whole (write-free) reconcile: the same problem
    leaves Degraded untouched, lastTransitionTime included, while Ready moves."""
    m = mirror()
    sts, ds = workloads(m, ready_replicas=0)
    first = compute_status(m, sts, ds, problems=[Problem("ResizeRefused", "no")], now=NOW)
    m["status"] = first
    sts, ds = workloads(m)
    later = compute_status(m, sts, ds, problems=[Problem("ResizeRefused", "no")],
                           now="2026-11-21T09:00:00Z")
    assert later["observedGeneration"] == 3
    assert cond(later, "Degraded") == cond(first, "Degraded")
    assert cond(later, "Ready")["status"] == "True"
    assert cond(later, "Ready")["lastTransitionTime"] == "2026-11-21T09:00:00Z"


def test_recomputing_an_unchanged_status_is_not_a_change() -> None:
    m = mirror()
    sts, ds = workloads(m)
    m["status"] = compute_status(m, sts, ds, problems=[], now=NOW)
    again = compute_status(m, sts, ds, problems=[], now="2026-11-21T10:00:00Z")
    assert not status_changed(m["status"], again)
    sts["status"]["readyReplicas"] = 0
    assert status_changed(m["status"], compute_status(m, sts, ds, problems=[], now=NOW))


def test_later_mirror_on_the_same_host_port_is_in_conflict() -> None:
    first = mirror("docker-hub", "2026-11-21T07:00:00Z", hostPort=5001)
    later = mirror("quay", "2026-11-21T07:30:00Z", hostPort=5001)
    other_port = mirror("gcr", "2026-11-21T06:00:00Z", hostPort=5003)
    everyone = [first, later, other_port]
    assert host_port_conflict(first, 5001, everyone) is None
    problem = host_port_conflict(later, 5001, everyone)
    assert problem is not None and problem.reason == "HostPortConflict"
    assert "registry-mirrors/docker-hub" in problem.message


def test_host_port_ties_are_broken_by_namespace_then_name_and_defaults_count() -> None:
    a = mirror("a", "2026-11-21T07:00:00Z")  # no hostPort: the default 5000
    b = mirror("b", "2026-11-21T07:00:00Z", hostPort=5000)
    b_other_ns = mirror("a", "2026-11-21T07:00:00Z", namespace="z-team", hostPort=5000)
    everyone = [b_other_ns, b, a]
    assert host_port_conflict(a, 5000, everyone) is None
    assert host_port_conflict(b, 5000, everyone) is not None
    assert host_port_conflict(b_other_ns, 5000, everyone) is not None


def test_the_mirror_already_serving_a_host_port_keeps_it_over_an_earlier_one() -> None:
    earlier = mirror("docker-hub", "2026-11-21T07:00:00Z", hostPort=5004)
    serving = mirror("gcr", "2026-11-21T07:30:00Z", hostPort=5004)
    everyone = [earlier, serving]
    holders = {serving["metadata"]["uid"]}
    assert host_port_conflict(serving, 5004, everyone, holders) is None
    problem = host_port_conflict(earlier, 5004, everyone, holders)
    assert problem is not None and "registry-mirrors/gcr, which holds it" in \
        problem.message
    # nobody serves it yet: the earliest, as before
    assert host_port_conflict(earlier, 5004, everyone, set()) is None


def test_only_a_mirror_whose_own_daemonset_uses_the_port_holds_it() -> None:
    moving = mirror("docker-hub", hostPort=5004)
    there = mirror("gcr", hostPort=5004)
    daemonsets = {"docker-hub": build.daemonset(moving, parse_spec(mirror(hostPort=5001))),
                  "gcr": build.daemonset(there, parse_spec(there))}
    assert port_holders(5004, [moving, there], lambda m: daemonsets[
        m["metadata"]["name"]]) == {there["metadata"]["uid"]}
    assert port_holders(5004, [moving, there], lambda m: None) == set()


def test_a_mirror_being_deleted_frees_its_host_port() -> None:
    first = mirror("a", "2026-11-21T07:00:00Z", hostPort=5001)
    first["metadata"]["deletionTimestamp"] = "2026-11-21T08:00:00Z"
    later = mirror("b", "2026-11-21T07:30:00Z", hostPort=5001)
    assert host_port_conflict(later, 5001, [first, later]) is None


def test_the_credentials_digest_is_of_the_credentials_alone_however_written() -> None:
    secret = {"metadata": {"name": "creds", "resourceVersion": "7"},
              "data": {"username": "dQ==", "password": "cA=="}}
    same = {"metadata": {"name": "creds", "resourceVersion": "8", "labels": {"team": "x"}},
            "data": {"username": "dQ==", "password": "cA==", "note": "eA=="}}
    written = {"metadata": {"name": "creds"}, "stringData": {"username": "u", "password": "p"}}
    rotated = {"metadata": {"name": "creds", "resourceVersion": "7"},
               "data": {"username": "dQ==", "password": "cTI="}}
    digest = credentials_digest(secret)
    assert credentials_digest(same) == credentials_digest(written) == digest
    assert credentials_digest(rotated) != digest


def test_the_credentials_digest_can_not_be_checked_against_guesses_without_the_secret() -> None:
    """Pod readers see the digest; without the Secret's uid, a guessed password's hash is
    not it (a trial matched plain sha256 digests to the passwords offline)."""
    import hashlib
    import json

    secret = {"metadata": {"name": "creds", "uid": "0b3c-secret-uid"},
              "data": {"username": "dQ==", "password": "cHcx"}}
    plain = hashlib.sha256(json.dumps(secret["data"], sort_keys=True).encode()).hexdigest()
    assert credentials_digest(secret) != plain[:16]
    again = {**secret, "metadata": {"name": "creds", "uid": "a-new-secret"}}
    assert credentials_digest(again) != credentials_digest(secret)


def pvc_with(size: str, storage_class: str | None = "standard") -> Obj:
    obj = build.pvc(mirror(), parse_spec(mirror()), size=size,
                    storage_class=storage_class)
    return obj


def test_pvc_grows_on_a_bigger_size() -> None:
    spec = parse_spec(mirror(storage={"size": "50Gi"}))
    size, cls, problems, resize = plan_pvc(pvc_with("20Gi"), spec)
    assert (size, cls, problems, resize) == ("50Gi", "standard", [], True)


def test_pvc_never_shrinks_and_says_so() -> None:
    spec = parse_spec(mirror(storage={"size": "10Gi"}))
    size, _, problems, resize = plan_pvc(pvc_with("20Gi"), spec)
    assert size == "20Gi" and not resize
    assert [p.reason for p in problems] == ["ShrinkRefused"]
    assert "20Gi" in problems[0].message and "10Gi" in problems[0].message


def test_pvc_keeps_its_storage_class_and_its_spelling_of_the_same_size() -> None:
    spec = parse_spec(mirror(storage={"size": "1Gi", "storageClassName": "fast"}))
    size, cls, problems, resize = plan_pvc(pvc_with("1024Mi"), spec)
    assert (size, cls, resize) == ("1024Mi", "standard", False)
    assert [p.reason for p in problems] == ["StorageClassImmutable"]
    # no class asked for: keep the one the default StorageClass filled in
    spec = parse_spec(mirror(storage={"size": "1Gi"}))
    assert plan_pvc(pvc_with("1Gi", "standard"), spec)[1] == "standard"
    assert plan_pvc(None, spec) == ("1Gi", None, [], False)


def test_a_class_asked_for_a_claim_made_without_one_is_refused_not_applied() -> None:
    """The claim was made with no class (none asked for, no default class): adding one
    would be refused by the API server, so the mirror keeps none and says why."""
    spec = parse_spec(mirror(storage={"size": "1Gi", "storageClassName": "fast"}))
    size, cls, problems, resize = plan_pvc(pvc_with("1Gi", None), spec)
    assert (size, resize) == ("1Gi", False)
    assert [p.reason for p in problems] == ["StorageClassImmutable"]
    assert "has no storage class" in problems[0].message and "fast" in problems[0].message
    claim = build.pvc(mirror(), spec, size=size, storage_class=cls)
    assert "storageClassName" not in claim["spec"]


def test_objects_of_the_same_name_not_created_by_eventop_block_the_mirror() -> None:
    m = mirror()
    foreign_pvc = {"kind": "PersistentVolumeClaim",
                   "metadata": {"name": "mirror-docker-hub-cache", "labels": {"app": "mine"}}}
    problem = foreign_objects(in_the_way(m, [foreign_pvc, None]))
    assert problem is not None and problem.reason == "NameConflict"
    assert problem.message.startswith("PersistentVolumeClaim mirror-docker-hub-cache already "
                                      "exists and was not created by eventop for this mirror; "
                                      "rename or remove it")
    # ours, for this mirror, owned by it or by an earlier mirror of the same name: fine
    ours = build.service(m)
    assert in_the_way(m, [ours]) == []
    ours["metadata"]["ownerReferences"] = [{"uid": "an-earlier-incarnation"}]
    assert in_the_way(m, [ours]) == []


def test_a_workload_held_in_deletion_by_a_finalizer_is_said_to_be_deleted() -> None:
    m = mirror()
    sts, ds = workloads(m)
    ds["metadata"].update(generation=2, deletionTimestamp=NOW,
                          finalizers=["example.com/keep"])
    ready = cond(compute_status(m, sts, ds, problems=[], now=NOW), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WorkloadDeleting")
    assert "DaemonSet mirror-docker-hub-node is being deleted" in ready["message"]
    assert "example.com/keep" in ready["message"]
    assert "observe generation" not in ready["message"]


def test_a_registry_that_was_ready_is_not_said_to_be_not_ready_yet() -> None:
    m = mirror()
    sts, ds = workloads(m)
    m["status"] = compute_status(m, sts, ds, problems=[], now=NOW)
    sts, ds = workloads(m, ready_replicas=0)
    m["status"] = compute_status(m, sts, ds, problems=[], now=NOW)
    ready = cond(m["status"], "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RegistryNotReady")
    assert "was ready before" in ready["message"] and "yet" not in ready["message"]
    # the next run (a workload event) keeps saying so
    again = cond(compute_status(m, sts, ds, problems=[], now=NOW), "Ready")
    assert "was ready before" in again["message"]


def test_a_refused_resize_says_the_servers_reason_without_its_struct_dump() -> None:
    """The 422 a real v1.24 API server answers (tests/recordings/errors/
    apply-422-pvc-resize-unbound.json), as the engine hands it over: on one line."""
    recorded = json.loads((RECORDINGS / "apply-422-pvc-resize-unbound.json").read_text())
    error = WriteError("apply", "PersistentVolumeClaim", "registry-mirrors",
                       "mirror-docker-hub-cache", one_line(recorded["message"]), 422, "Invalid")
    spec = parse_spec(mirror(storage={"size": "50Gi"}))
    (problem,) = write_problems(Outcome(errors=[error]), spec, resize=True)
    assert problem.reason == "ResizeRefused"
    assert problem.message.endswith(
        "(422 Invalid): PersistentVolumeClaim \"cache\" is invalid: spec: Forbidden: spec is "
        "immutable after creation except resources.requests for bound claims")


def test_a_rollout_whose_new_registry_pod_never_gets_ready_says_so_with_one_warning() -> None:
    """A trial: a ttl change whose new pod never got ready read "no ready registry pod yet",
    Degraded False, and no Event at all."""
    m = mirror()
    sts, ds = workloads(m)
    m["status"] = compute_status(m, sts, ds, problems=[], now=NOW)  # Ready
    sts, ds = rolling(m, "registry pod not updated")
    m["status"] = compute_status(m, sts, ds, problems=[], now=NOW)
    assert cond(m["status"], "Ready")["reason"] == "RollingOut"
    sts["status"]["readyReplicas"] = 0  # the old pod is gone, the new one is not ready
    new = compute_status(m, sts, ds, problems=[], now=NOW)
    ready = cond(new, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RegistryNotReady")
    assert ready["message"].startswith(
        "StatefulSet mirror-docker-hub has no ready registry pod: the pod of the current spec "
        "is not ready (StatefulSet mirror-docker-hub: 0 of 1 registry pod(s) updated)")
    assert "yet" not in ready["message"]
    [note] = transition_notes(m["status"], new)
    assert (note.type, note.reason) == ("Warning", "RegistryNotReady")
    m["status"] = new
    assert transition_notes(m["status"], compute_status(m, sts, ds, problems=[], now=NOW)) == []


def test_a_new_mirror_not_ready_yet_posts_no_warning() -> None:
    m = mirror()
    sts, ds = workloads(m, ready_replicas=0)
    new = compute_status(m, sts, ds, problems=[], now=NOW)
    assert "yet" in cond(new, "Ready")["message"]
    assert transition_notes(m.get("status") or {}, new) == []
