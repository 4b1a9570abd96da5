"""``spec.image`` and ``spec.version`` together: the image's tag, when it names a version,
is what runs (and what the status reports), and its major must be the spec's (found on a
real v1.24 API server: a v16 Database was rolled onto 17 binaries)."""

from __future__ import annotations

import pytest

from eventop.handlers.databases.spec import Version, image_version
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
    world.edit(version="17.9")  # the image still says 17.7: 17.7 runs
    world.converge()
    assert world.db["status"]["version"] == "17.7"
    assert not [r for _, r, _ in world.events if r == "Upgraded"]
    world.edit(image="postgres:17.9-alpine")
    world.converge()
    backup = next(n for n in world.names("Job") if n.startswith("orders-backup-17-9-"))
    world.job_done(backup)
    world.converge()
    world.statefulset_ready("orders-pg17")
    world.converge()
    assert world.db["status"]["version"] == "17.9"
    upgraded = [m for _, r, m in world.events if r == "Upgraded"]
    assert upgraded == ["PostgreSQL 17.7 -> 17.9 now serves"]


def test_an_image_whose_tag_names_no_version_is_named_in_the_events() -> None:
    world = created(World(database(version="17.7")))
    world.edit(image="postgres:latest")
    world.converge()
    backup = next(n for n in world.names("Job") if n.startswith("orders-backup-17-7-"))
    world.job_done(backup)
    world.converge()
    world.statefulset_ready("orders-pg17")
    world.converge()
    assert world.db["status"]["version"] == "17.7"  # spec.version, trusted
    upgraded = [m for _, r, m in world.events if r == "Upgraded"]
    assert upgraded == ["PostgreSQL 17.7 -> 17.7 (image postgres:latest) now serves"]
