"""A Database's life through the watcher, the router and its engine on the real API server
(``pytest -m cluster``, ``EVENTOP_TEST_KUBECONFIG``): the steps of ``tests.databases.lives``,
which the default suite runs on the local API server, here with everything a real cluster
adds: its StatefulSet controller making the pods and data claims and rolling them one by
one, its Job and garbage-collector controllers, admission (the namespace enforces the
``restricted`` Pod Security standard, so every pod the Database makes is admitted only if it
meets it), and the snapshot API installed from its CRDs or absent.

The test cluster has no kubelet and no snapshot controller: the test marks pods Ready,
Jobs finished and VolumeSnapshots ready, as they would (``tests.databases.play``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from eventop.handlers.databases.volumes import RECLAIM_ANNOTATION
from eventop.kube import KubeError
from eventop.testing import Pipeline, RealCluster, wait_until
from eventop.testing.cluster import load_crds
from tests.databases import lives
from tests.databases.lives import DB, Life
from tests.databases.play import PLAYED_VOLUME, SNAPSHOTS, Components
from tests.databases.test_pipeline import EVERY_HANDLER

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
CRDS = HERE.parents[1] / "crds"
SNAPSHOT_CRDS = HERE / "schemas"
TIMEOUT = 90.0


@pytest.fixture(scope="module")
def cluster() -> RealCluster:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    return RealCluster(kubeconfig, [CRDS, SNAPSHOT_CRDS])


@contextlib.contextmanager
def restricted_namespace(cluster: RealCluster) -> Iterator[str]:
    """A namespace enforcing the restricted Pod Security standard; whatever Database is
    left in it at the end (a Retain one made again, a failed test) loses its finalizer
    first, so it can go."""
    name = f"eventop-db-{uuid.uuid4().hex[:6]}"
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    try:
        yield name
    finally:
        for db in cluster.list(DB, name):
            with contextlib.suppress(KubeError):
                cluster.kube.patch("eventop.dev/v1", "Database", db["metadata"]["name"], name,
                                   {"metadata": {"finalizers": None}})
        cluster.kube.delete("v1", "Namespace", name)
        for pv in cluster.kube.list("v1", "PersistentVolume",
                                    label_selector=f"{PLAYED_VOLUME}={name}"):
            with contextlib.suppress(KubeError):
                cluster.kube.delete("v1", "PersistentVolume", pv["metadata"]["name"])


@pytest.fixture
def with_snapshot_api(cluster: RealCluster) -> Iterator[tuple[Pipeline, str]]:
    for crd in load_crds([SNAPSHOT_CRDS]):
        cluster.world.apply(crd, force=True)
    cluster.wait_for(lambda: not cluster.kube.missing_kinds([(SNAPSHOTS, "VolumeSnapshot")]),
                     60, "the snapshot API served")
    with restricted_namespace(cluster) as ns, Pipeline(
            cluster, builtin=EVERY_HANDLER, watcher=True) as pipe:
        yield pipe, ns


@pytest.fixture
def without_snapshot_api(cluster: RealCluster) -> Iterator[tuple[Pipeline, str]]:
    """The snapshot CRDs removed for the test (and installed again after it)."""
    crds = load_crds([SNAPSHOT_CRDS])
    for crd in crds:
        with contextlib.suppress(KubeError):
            cluster.kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                crd["metadata"]["name"])
    cluster.wait_for(lambda: cluster.kube.missing_kinds([(SNAPSHOTS, "VolumeSnapshot")]),
                     60, "the snapshot API gone")
    try:
        with restricted_namespace(cluster) as ns, Pipeline(
                cluster, builtin=EVERY_HANDLER, watcher=True) as pipe:
            yield pipe, ns
    finally:
        for crd in crds:
            cluster.world.apply(crd, force=True)


def orders_life(cluster: RealCluster, ns: str) -> Life:
    """Database ``orders`` in ``ns``, its controllers played as on the real cluster."""
    return Life(cluster, Components(cluster, real=True, timeout=TIMEOUT), ns, "orders",
                TIMEOUT)


def test_a_database_is_served_backed_up_scaled_upgraded_and_snapshotted_when_deleted(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str]) -> None:
    _pipe, ns = with_snapshot_api
    life = orders_life(cluster, ns)
    lives.serve(life, version="16.10", replicas=1)
    lives.backups(life)
    lives.scale(life, 2)
    lives.minor_upgrade(life, "16.11")
    lives.major_upgrade(life, 17)
    snapshots = lives.delete_with_snapshots(life)
    assert len(snapshots) == 4  # two servers of each major


def test_retain_keeps_the_data_for_the_next_database_and_delete_deletes_it(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str]) -> None:
    _pipe, ns = with_snapshot_api
    play = Components(cluster, real=True, timeout=TIMEOUT)
    keep, scratch = (Life(cluster, play, ns, name, TIMEOUT) for name in ("keep", "scratch"))
    for life, policy in ((keep, "Retain"), (scratch, "Delete")):
        life.create(version="16", deletionPolicy=policy)
    for life in (keep, scratch):
        life.object("apps/v1/StatefulSet", life.names.statefulset(16))
        play.servers_ready(life.names.statefulset(16), ns)
        life.wait("its data volume", lambda life=life: lives.data_volumes(life))
    lives.delete_retained_then_adopted(keep)
    lives.delete_deleting_the_data(scratch)
    # the Database created again on the kept data, deleted under Delete: its adopted data
    # volumes go as its own would
    keep.edit(deletionPolicy="Delete")
    play.servers_ready(keep.names.statefulset(16), ns)
    lives.delete_deleting_the_data(keep)


def test_a_database_deleted_with_cascade_orphan_keeps_its_running_server_and_its_data(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str]) -> None:
    _pipe, ns = with_snapshot_api
    life = orders_life(cluster, ns)
    lives.serve(life, version="16.10", replicas=1)
    lives.delete_orphaning(life)


def test_without_the_snapshot_api_the_router_is_ready_and_deletion_takes_a_final_backup(
        cluster: RealCluster, without_snapshot_api: tuple[Pipeline, str]) -> None:
    pipe, ns = without_snapshot_api
    life = orders_life(cluster, ns)
    lives.serve(life, version="16", replicas=1)
    answers: list[requests.Response] = []

    def ready() -> bool:
        answers.append(requests.get(f"{pipe.url}/readyz", timeout=10))
        return answers[-1].status_code == 200
    assert wait_until(ready, 30), answers[-1].text  # an optional API never holds it back
    lives.delete_with_a_final_backup(life)


@pytest.mark.parametrize("router", ["running", "down"])
def test_a_deleted_namespace_keeps_the_data_on_retained_volumes_unless_the_policy_deletes(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str], router: str) -> None:
    """The namespace controller deletes the data volumes' claims with everything else, and
    nothing (no snapshot, no backup Job, no Event) can be created in a terminating
    namespace: a Snapshot (the default) or Retain Database has set its volumes'
    PersistentVolumes to Retain already while it lived, once bound (recording the policy
    they had), so a namespace deleted with no router running loses nothing either; a
    Delete one leaves them be. The namespace then finishes deleting: nothing holds it.
    With the router ``down`` (found on a real API server: the data was lost), the claims
    go at once, the Databases stay (their finalizer), and the volumes are Retain already."""
    pipe, ns = with_snapshot_api
    play = Components(cluster, real=True, timeout=TIMEOUT)
    lifes = {policy: Life(cluster, play, ns, name, TIMEOUT) for policy, name in
             (("Snapshot", "orders"), ("Retain", "keep"), ("Delete", "scratch"))}
    volumes = {}
    try:
        for policy, life in lifes.items():
            life.create(version="16", deletionPolicy=policy)
            claim = f"data-{life.names.statefulset(16)}-0"
            # no provisioner here: a CSI volume, bound to the claim by its claimRef
            volumes[policy] = cluster.put({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": f"pv-{ns}-{life.name}"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Delete",
                         "csi": {"driver": "disk.csi.example.com",
                                 "volumeHandle": f"{ns}-{life.name}"},
                         "claimRef": {"namespace": ns, "name": claim}}})["metadata"]["name"]
        for life in lifes.values():
            life.object("apps/v1/StatefulSet", life.names.statefulset(16))
            play.servers_ready(life.names.statefulset(16), ns)
            play.job_finished(life.names.init_job, ns)
            life.status("Ready", lambda s: s["phase"] == "Ready")

        def reclaim() -> dict[str, tuple[str, str | None]]:
            found = {policy: cluster.get("v1/PersistentVolume", pv)
                     for policy, pv in volumes.items()}
            return {policy: (pv["spec"]["persistentVolumeReclaimPolicy"],
                             (pv["metadata"].get("annotations") or {}).get(RECLAIM_ANNOTATION))
                    for policy, pv in found.items()}
        kept = {"Snapshot": ("Retain", "Delete"), "Retain": ("Retain", "Delete"),
                "Delete": ("Delete", None)}
        # before anything is deleted: bound, the volumes are set by the live Databases' runs
        assert cluster.wait_for(lambda: reclaim() == kept, TIMEOUT,
                                "volumes set to Retain while the Databases live")
        if router == "down":
            pipe.close()
        cluster.kube.delete("v1", "Namespace", ns)
        if router == "down":
            claims = [f"data-{life.names.statefulset(16)}-0" for life in lifes.values()]
            assert cluster.wait_for(lambda: all(
                cluster.get("v1/PersistentVolumeClaim", claim, ns) is None
                for claim in claims), TIMEOUT, "the claims deleted by the namespace controller")
            assert reclaim() == kept
            for life in lifes.values():  # (no router comes back in this test to let them go)
                assert life.get(DB, life.name) is not None
                cluster.kube.patch("eventop.dev/v1", "Database", life.name, ns,
                                   {"metadata": {"finalizers": None}})
        for life in lifes.values():
            life.gone(DB, life.name)
        assert cluster.wait_for(lambda: cluster.get("v1/Namespace", ns) is None, TIMEOUT,
                                f"namespace {ns} deleted")
        assert reclaim() == kept
    finally:
        for pv in volumes.values():
            with contextlib.suppress(KubeError):
                cluster.kube.delete("v1", "PersistentVolume", pv)


def test_a_port_change_moves_the_services_and_the_server_leaving_no_old_port_behind(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str]) -> None:
    """The children were created by POST: the first apply of a changed port must remove
    the old one (a reviewer saw both Services refused with 'Duplicate value: "postgres"',
    and a StatefulSet with both ports, when the POST's fields were never handed over)."""
    _pipe, ns = with_snapshot_api
    life = orders_life(cluster, ns)
    lives.serve(life, version="16", replicas=1)
    life.edit(port=5433)

    def ports(kind: str, name: str) -> list[int]:
        obj = life.get(kind, name) or {}
        if kind.endswith("StatefulSet"):
            return [p["containerPort"] for p in
                    obj["spec"]["template"]["spec"]["containers"][0]["ports"]]
        return [p["port"] for p in obj["spec"]["ports"]]
    for kind, name in (("v1/Service", "orders"), ("v1/Service", life.names.headless),
                       ("apps/v1/StatefulSet", life.names.statefulset(16))):
        life.wait(f"{kind} {name} on 5433 alone",
                  lambda kind=kind, name=name: ports(kind, name) == [5433])
    ready = lives.condition(life.get(DB, "orders")["status"], "Ready")
    assert ready["reason"] != "WriteRefused", ready


def test_a_service_port_edited_by_hand_is_put_back_keeping_its_cluster_ip(
        cluster: RealCluster, with_snapshot_api: tuple[Pipeline, str]) -> None:
    _pipe, ns = with_snapshot_api
    life = orders_life(cluster, ns)
    lives.serve(life, version="16", replicas=1)
    lives.service_port_edited_by_hand(life)
