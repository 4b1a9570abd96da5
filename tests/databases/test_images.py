"""``spec.image`` and ``spec.version`` together: the image's tag, when it names a version,
is what runs (and what the status reports), and its major must be the spec's (found on a
real v1.24 API server: a v16 Database was rolled onto 17 binaries)."""

from __future__ import annotations

import copy

import pytest

from eventop.handlers.databases.spec import Version, image_version
from eventop.handlers.databases.workload import VERSION_LABEL
from tests.databases.test_lifecycle import created
from tests.databases.world import World, database


@pytest.mark.parametrize(("image", "version"), [
    ("postgres:17.7-alpine", Version(17, 7)),
    ("postgres:17", Version(17)),
    ("postgres:16-bookworm", Version(16)),
    ("docker.io/library/postgres:16.11", Version(16, 11)),
    ("registry.example:5000/mirror/postgres:15.4-alpine3.20", Version(15, 4)),
    ("postgres:17.2@sha256:" + "a" * 64, Version(17, 2)),
])
def test_an_official_style_tag_names_the_version_it_runs(image: str, version: Version
                                                         ) -> None:
    assert image_version(image) == version


@pytest.mark.parametrize("image", [
    "postgres:latest", "postgres", "postgres@sha256:" + "a" * 64,
    "registry.example:5000/postgres", "postgis/postgis:16-3.4", "mycorp/pg:17.1",
])
def test_a_tag_that_names_no_version_of_a_postgres_repository_names_none(image: str) -> None:
    assert image_version(image) is None


def test_an_image_of_another_major_is_refused_and_changes_nothing() -> None:
    world = created(World(database()))
    before = world.get("StatefulSet", "orders-pg16")["spec"]
    world.edit(image="postgres:17.2")
    world.converge()
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ImageVersionMismatch")
    assert "postgres:17.2" in ready["message"] and "16" in ready["message"]
    assert world.get("StatefulSet", "orders-pg16")["spec"] == before
    assert not [n for n in world.names("Job") if n.startswith("orders-backup-")]
    assert [m for t, _, m in world.events if t == "Warning"] == [
        "spec.image 'postgres:17.2' runs PostgreSQL 17.2 but spec.version is 16: the major "
        "versions must be the same (set spec.version to 17 to upgrade, or use a PostgreSQL 16 "
        "image)"]


def test_status_and_events_report_the_version_the_image_tag_names() -> None:
    world = created(World(database(version="17", image="postgres:17.7-alpine")))
    assert world.db["status"]["version"] == "17.7"  # (was the bare major, 17)
    world.edit(version="17.9")  # the image still says 17.7: contradictory, refused
    world.converge()
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ImageVersionMismatch")
    assert world.condition("Progressing")["message"] != \
        "PostgreSQL 17.7, as spec.version asks: no upgrade under way"
    assert world.db["status"]["version"] == "17.7"
    assert not [r for _, r, _ in world.events if r == "Upgraded"]
    world.edit(image="postgres:17.9-alpine")
    world.converge()
    world.backed_up_and_rolled("17-9-", "orders-pg17")
    assert world.db["status"]["version"] == "17.9"
    upgraded = [m for _, r, m in world.events if r == "Upgraded"]
    assert upgraded == ["PostgreSQL 17.7 -> 17.9 now serves"]


def test_an_image_whose_tag_names_no_version_is_named_in_the_events() -> None:
    world = created(World(database(version="17.7")))
    world.edit(image="postgres:latest")
    world.converge()
    world.backed_up_and_rolled("17-7-", "orders-pg17")
    assert world.db["status"]["version"] == "17.7"  # spec.version, trusted
    upgraded = [m for _, r, m in world.events if r == "Upgraded"]
    assert upgraded == ["PostgreSQL 17.7 -> 17.7 (image postgres:latest) now serves"]


def as_an_earlier_release_wrote(world: World, sts_name: str, version: str) -> None:
    """The StatefulSet's version label and status.version as a release before the image's
    tag was read wrote them: its ``resolve`` returned spec.version as written whenever
    spec.image was set (``"16"`` with ``postgres:16.4`` ran as 16)."""
    sts = world.get("StatefulSet", sts_name)
    sts["metadata"]["labels"][VERSION_LABEL] = version
    sts["spec"]["template"]["metadata"]["labels"][VERSION_LABEL] = version
    world.db["status"]["version"] = version


def test_a_major_version_on_a_minor_tag_an_earlier_release_ran_restarts_no_server() -> None:
    """``version: "16"`` with ``postgres:16.4``: the label went from 16 to 16.4 after an
    upgrade of the router, and every server restarted onto the same binaries."""
    world = created(World(database(version="16", image="postgres:16.4")))
    as_an_earlier_release_wrote(world, "orders-pg16", "16")
    before = copy.deepcopy(world.get("StatefulSet", "orders-pg16"))
    seen = len(world.events)
    world.converge()
    assert world.get("StatefulSet", "orders-pg16") == before  # no rollout
    assert world.db["status"]["version"] == "16.4"  # the tag's, from now on
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "Stable")
    assert progressing["message"].startswith("PostgreSQL 16.4")
    assert world.events[seen:] == []  # nothing was upgraded, nothing is wrong
    assert not [n for n in world.names("Job") if n.startswith("orders-backup-")]
    # a real upgrade later is one, reported from the tag's version
    world.edit(image="postgres:16.6")
    world.converge()
    world.backed_up_and_rolled("16-6-", "orders-pg16")
    assert world.get("StatefulSet", "orders-pg16")["metadata"]["labels"][
        VERSION_LABEL] == "16.6"
    assert [m for _, r, m in world.events if r == "Upgraded"] == [
        "PostgreSQL 16.4 -> 16.6 now serves"]


def test_a_minor_version_the_tag_contradicts_is_refused_not_a_downgrade_for_good() -> None:
    """``version: "17.9"`` with ``postgres:17.7``, reported 17.9 by an earlier release:
    the router's upgrade said DowngradeRefused, "set spec.version back to 17.9", which it
    was. It is refused as contradictory, and the fix it names applies without a
    rollout, a downgrade or an Upgraded Event."""
    world = created(World(database(version="17.7", image="postgres:17.7")))
    world.db["spec"]["version"] = "17.9"  # (what the earlier release ran it with)
    as_an_earlier_release_wrote(world, "orders-pg17", "17.9")
    before = copy.deepcopy(world.get("StatefulSet", "orders-pg17"))
    seen = len(world.events)
    world.converge()
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ImageVersionMismatch")
    assert "set spec.version to 17.7 or 17" in ready["message"]
    assert world.get("StatefulSet", "orders-pg17") == before
    for version in ("17.7", "17"):
        world.edit(version=version)
        world.converge()
        progressing = world.condition("Progressing")
        assert (progressing["status"], progressing["reason"]) == ("False", "Stable")
        assert world.condition("Ready")["reason"] == "Running"
        assert world.db["status"]["version"] == "17.7"
        assert world.get("StatefulSet", "orders-pg17")["spec"] == before["spec"]
    reasons = [r for _, r, _ in world.events[seen:]]
    assert "DowngradeRefused" not in reasons and "Upgraded" not in reasons


def test_a_minor_version_the_tag_contradicts_does_not_hold_the_deletion() -> None:
    """The status an earlier release wrote (17.9 on postgres:17.7) is refused now; the
    deletion works with what runs instead of keeping the Database for good."""
    world = created(World(database(version="17.7", image="postgres:17.7")))
    world.db["spec"]["version"] = "17.9"
    as_an_earlier_release_wrote(world, "orders-pg17", "17.9")
    world.converge()
    world.delete()
    world.converge()
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    assert world.get("StatefulSet", "orders-pg17")["spec"]["replicas"] == 0
