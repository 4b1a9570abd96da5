"""What the status says about writes the API server refused and spec fields that can not
be applied: ``Ready`` is about the servers serving; the backups' own trouble is in
``BackupHealthy``; an immutable field asked to change is said, not silently ignored."""

from __future__ import annotations

import copy
from typing import Any

from eventop.engine import Outcome, WriteError
from eventop.handlers.databases.controller import backup_children, with_outcome
from eventop.kube import get_condition
from tests.databases.test_lifecycle import created
from tests.databases.world import World, database


def _refused(kind: str, name: str) -> Outcome:
    return Outcome(errors=[WriteError(
        "apply", kind, "shop", name, "spec.resources.requests.storage: Forbidden: field "
        "can not be less than previous value", status=422, reason="Invalid")])


def test_a_refused_write_of_the_backup_volume_leaves_ready_to_the_servers() -> None:
    """A refused resize of the backup claim made a Database whose every server was ready
    read Ready=False WriteRefused, phase Degraded (found on a real v1.24 API server)."""
    world = created(World(database()))
    status = world.db["status"]
    assert status["phase"] == "Ready"
    new = with_outcome(status, _refused("PersistentVolumeClaim", "orders-backups"),
                       backup_children(world.db))
    assert new["phase"] == "Ready"
    assert get_condition(new, "Ready")["status"] == "True"
    backup = get_condition(new, "BackupHealthy")
    assert (backup["status"], backup["reason"]) == ("False", "BackupWriteRefused")
    assert "orders-backups" in backup["message"]


def test_a_refused_write_of_a_server_child_makes_the_database_not_ready() -> None:
    world = created(World(database()))
    new = with_outcome(world.db["status"], _refused("StatefulSet", "orders-pg16"),
                       backup_children(world.db))
    assert new["phase"] == "Degraded"
    ready = get_condition(new, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WriteRefused")


def test_a_storage_class_added_to_the_data_volumes_is_reported_not_ignored() -> None:
    world = created(World(database()))
    world.edit(storage={"size": "5Gi", "storageClassName": "fast"})
    world.converge()
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "StorageClassImmutable")
    assert progressing["message"].startswith(
        "spec.storage.storageClassName fast is not applied: the data volumes were made "
        "without a class")
    template = world.get("StatefulSet", "orders-pg16")["spec"]["volumeClaimTemplates"][0]
    assert "storageClassName" not in template["spec"]
    assert ("Warning", "StorageClassImmutable") in [(t, r) for t, r, _ in world.events]
    world.edit(storage={"size": "5Gi"})
    world.converge()
    assert world.condition("Progressing")["reason"] == "Stable"


def test_a_changed_backup_storage_class_is_reported_not_ignored() -> None:
    world = created(World(database()))
    world.get("PersistentVolumeClaim", "orders-backups")["spec"]["storageClassName"] = "std"
    world.edit(backup={"schedule": "0 0 * * *", "retention": 7,
                       "storage": {"size": "5Gi", "storageClassName": "fast"}})
    world.converge()
    progressing = world.condition("Progressing")
    assert progressing["reason"] == "StorageClassImmutable"
    assert "PersistentVolumeClaim orders-backups uses class std" in progressing["message"]
    assert world.get("PersistentVolumeClaim", "orders-backups")["spec"][
        "storageClassName"] == "std"


def _warnings(world: World) -> list[str]:
    return [r for t, r, _ in world.events if t == "Warning"]


def test_a_server_going_down_posts_one_warning_and_its_return_a_normal_event() -> None:
    """"0 of 1 servers ready" posted no Warning (found on a real v1.24 API server)."""
    world = created(World(database(replicas=3)))
    world.statefulset_ready("orders-pg16", ready=2)
    world.converge()
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ServersDown")
    assert ready["message"].startswith("2 of 3 servers ready")
    assert world.db["status"]["phase"] == "Degraded"
    world.statefulset_ready("orders-pg16", ready=0)
    world.converge()
    world.advance(minutes=5)
    world.converge()
    assert world.condition("Ready")["reason"] == "ServersDown"
    assert _warnings(world) == ["ServersDown"]
    world.statefulset_ready("orders-pg16")
    world.converge()
    assert world.condition("Ready")["reason"] == "Running"
    assert ("Normal", "Recovered") in [(t, r) for t, r, _ in world.events]


def test_servers_not_ready_yet_after_a_scale_up_are_no_warning() -> None:
    world = created(World(database()))
    world.edit(replicas=3)
    world.converge()
    world.statefulset_ready("orders-pg16", ready=1)
    world.converge()
    assert world.condition("Ready")["reason"] == "StandbysNotReady"
    assert _warnings(world) == []


def test_a_rollout_of_the_current_spec_reads_as_progressing_not_degraded() -> None:
    """A port change rolled the pods while the status said Degraded and "Progressing=False
    Stable ... no upgrade under way" (found on a real v1.24 API server)."""
    world = created(World(database()))
    world.edit(port=5433)
    world.converge()
    world.statefulset_rolling("orders-pg16")
    world.get("StatefulSet", "orders-pg16")["status"]["readyReplicas"] = 0
    world.converge()
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert progressing["message"] == \
        "rolling the servers out to the current spec (0 of 1 updated, 0 ready)"
    assert world.db["status"]["phase"] != "Degraded"
    assert _warnings(world) == []
    world.statefulset_ready("orders-pg16")
    world.converge()
    assert world.condition("Progressing")["reason"] == "Stable"
    assert world.db["status"]["phase"] == "Ready"
    assert _warnings(world) == []


def test_a_rollout_under_an_unapplied_storage_class_is_no_servers_down_warning() -> None:
    """RollingOut was set only while Progressing had nothing else to say: with
    StorageClassImmutable set, a resources change rolled the pods and Ready read
    ServersDown with a Warning."""
    world = created(World(database()))
    world.edit(storage={"size": "5Gi", "storageClassName": "fast"})
    world.converge()
    world.edit(resources={"requests": {"cpu": "200m", "memory": "256Mi"},
                          "limits": {"memory": "1Gi"}})
    world.converge()
    world.statefulset_rolling("orders-pg16")
    world.get("StatefulSet", "orders-pg16")["status"]["readyReplicas"] = 0
    world.converge()
    assert world.condition("Progressing")["reason"] == "StorageClassImmutable"
    assert world.condition("Ready")["reason"] == "ServerNotReady"
    assert _warnings(world) == ["StorageClassImmutable"]


def _older(name: str) -> dict[str, Any]:
    other = database(name)
    other["metadata"].update(uid="0b9d3c1e-1111-4c52-9f0e-6d1c7e3a2b10",
                             creationTimestamp="2026-11-20T09:00:00Z")
    return other


def test_a_taken_headless_service_name_leaves_the_address_and_ready_to_the_servers() -> None:
    """Database ``orders`` beside an older ``orders-hl``: only its headless Service's name
    is taken; its client Service ``orders``, which ``host`` names, is its own. Stripping
    ``host`` and ``uri`` broke every application pod reading ``uri``, and Ready=False,
    phase Failed, said a serving Database did not serve."""
    world = created(World(database()))
    secret = copy.deepcopy(world.get("Secret", "orders-credentials"))
    world.neighbours = [_older("orders-hl")]
    world.converge()
    assert world.get("Secret", "orders-credentials")["data"] == secret["data"]
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "NameCollision")
    assert progressing["message"].startswith(
        "Database orders-hl's client Service is named orders-hl, the name of this "
        "Database's headless Service")
    assert world.condition("Ready")["reason"] == "Running"
    assert world.db["status"]["phase"] == "Ready"
    assert world.db["status"]["version"] == "16.11"
    assert _warnings(world) == ["NameCollision"]


def test_a_taken_client_service_name_makes_it_not_ready_and_takes_the_address() -> None:
    """Database ``shop-hl`` beside an older ``shop``: its client Service's name is the
    other's headless Service, so ``host`` would send clients to the other servers."""
    world = World(database("shop-hl"))
    world.converge()
    world.statefulset_ready("shop-hl-pg16")
    world.converge()
    world.job_done("shop-hl-init")
    world.converge()
    world.neighbours = [_older("shop")]
    world.converge()
    data = world.get("Secret", "shop-hl-credentials")["data"]
    assert "host" not in data and "uri" not in data and "password" in data
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameCollision")
    assert world.db["status"]["phase"] == "Failed"
    assert "endpoint" not in world.db["status"]
    assert _warnings(world) == ["NameCollision"]  # one Event, in two conditions
