"""A Database's life through the whole pipeline on the local API server: the test changes
the cluster, the watcher posts what it sees, the router's engine runs the Database handler
(``tests.databases.lives``, the same steps the cluster suite runs on a real API server).

The local API server runs no StatefulSet, Job or snapshot controller: the test plays them
(``tests.databases.play``). What only a real cluster shows (its garbage collector's timing,
admission, Pod Security, the StatefulSet controller's rolling updates) is in
``test_cluster_pipeline.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from eventop.handlers import BUILTIN
from eventop.testing import LocalCluster, Pipeline, wait_until
from tests.databases import lives
from tests.databases.lives import Life
from tests.databases.play import Components

HERE = Path(__file__).resolve().parent
CRDS = HERE.parents[1] / "crds"
SNAPSHOT_CRDS = HERE / "schemas"
EVERY_HANDLER = ",".join(b.rsplit(".", 1)[-1] for b in BUILTIN)


def running(cluster: LocalCluster) -> Pipeline:
    """The router and the watcher as deployed: every built-in handler, the watcher's own
    resources (what the handlers listen to: VolumeSnapshots too, where served)."""
    return Pipeline(cluster, builtin=EVERY_HANDLER, watcher=True)


@pytest.fixture
def namespace() -> str:
    return f"shop-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def with_snapshot_api(namespace: str) -> Iterator[tuple[LocalCluster, Pipeline]]:
    cluster = LocalCluster([CRDS, SNAPSHOT_CRDS])
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        with running(cluster) as pipe:
            yield cluster, pipe
    finally:
        cluster.close()


@pytest.fixture
def without_snapshot_api(namespace: str) -> Iterator[tuple[LocalCluster, Pipeline]]:
    cluster = LocalCluster([CRDS])
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        with running(cluster) as pipe:
            yield cluster, pipe
    finally:
        cluster.close()



def orders_life(cluster: LocalCluster, namespace: str) -> Life:
    """Database ``orders`` in ``namespace``, its controllers played on the local server."""
    return Life(cluster, Components(cluster, real=False), namespace, "orders")

def test_a_database_is_served_backed_up_scaled_upgraded_and_snapshotted_when_deleted(
        with_snapshot_api: tuple[LocalCluster, Pipeline], namespace: str) -> None:
    cluster, _pipe = with_snapshot_api
    life = orders_life(cluster, namespace)
    lives.serve(life, version="16.10", replicas=1)
    lives.backups(life)
    lives.scale(life, 2)
    lives.minor_upgrade(life, "16.11")
    lives.major_upgrade(life, 17)
    snapshots = lives.delete_with_snapshots(life)
    assert len(snapshots) == 4  # two servers of each major


def test_retain_keeps_the_data_for_the_next_database_and_delete_deletes_it(
        with_snapshot_api: tuple[LocalCluster, Pipeline], namespace: str) -> None:
    cluster, _pipe = with_snapshot_api
    play = Components(cluster, real=False)
    keep = Life(cluster, play, namespace, "keep")
    scratch = Life(cluster, play, namespace, "scratch")
    for life, policy in ((keep, "Retain"), (scratch, "Delete")):
        life.create(version="16", deletionPolicy=policy)
        life.object("apps/v1/StatefulSet", life.names.statefulset(16))
        play.servers_ready(life.names.statefulset(16), namespace)
    lives.delete_retained_then_adopted(keep)
    lives.delete_deleting_the_data(scratch)


def test_without_the_snapshot_api_the_router_is_ready_and_deletion_takes_a_final_backup(
        without_snapshot_api: tuple[LocalCluster, Pipeline], namespace: str) -> None:
    cluster, pipe = without_snapshot_api
    life = orders_life(cluster, namespace)
    lives.serve(life, version="16", replicas=1)
    answers: list[requests.Response] = []

    def ready() -> bool:
        answers.append(requests.get(f"{pipe.url}/readyz", timeout=10))
        return answers[-1].status_code == 200
    assert wait_until(ready, 30), answers[-1].text  # an optional API never holds it back
    assert "VolumeSnapshot" not in answers[-1].text
    lives.delete_with_a_final_backup(life)



def test_a_service_port_edited_by_hand_is_put_back_keeping_its_cluster_ip(
        with_snapshot_api: tuple[LocalCluster, Pipeline], namespace: str) -> None:
    cluster, _pipe = with_snapshot_api
    life = orders_life(cluster, namespace)
    lives.serve(life, version="16", replicas=1)
    lives.service_port_edited_by_hand(life)
