"""Replaying a recording with the kit: the changes happen on the cluster, the events are
delivered in order, shuffled or duplicated."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop.testing import LocalCluster, recorded_changes, replay

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "recordings" / "copy-rules"
Obj = dict[str, Any]


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster([REPO / "crds"])
    try:
        yield cluster
    finally:
        cluster.close()


def _key(change: str, obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return change, obj["kind"], meta.get("namespace", ""), meta["name"]


def _state(cluster: LocalCluster) -> set[tuple[str, str, str]]:
    return {(kind, o["metadata"].get("namespace", ""), o["metadata"]["name"])
            for kind, version in (("ConfigMap", "v1"), ("Secret", "v1"),
                                  ("CopyRule", "eventop.dev/v1"))
            for o in cluster.list(version, kind)}


def test_in_order_delivers_each_change_after_making_it(cluster: LocalCluster) -> None:
    changes = recorded_changes(RECORDING)
    seen: list[tuple[str, str, str, str]] = []

    def deliver(change: str, obj: Obj) -> bool:
        """Whether the event carries the cluster's object as it is when delivered (its
        resourceVersion is this server's, which a router's cache compares with); a removed
        object is gone and carries no resourceVersion."""
        seen.append(_key(change, obj))
        meta = obj["metadata"]
        now = cluster.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        if "resourceVersion" not in meta:
            return now is None
        return now is not None and now["metadata"]["resourceVersion"] == meta["resourceVersion"]

    answers = replay(cluster, RECORDING, deliver)
    assert seen == [_key(c, o) for c, o in changes]
    assert len(answers) == len(changes) and all(answers)


def test_duplicated_delivers_every_change_twice_in_order(cluster: LocalCluster) -> None:
    seen: list[tuple[str, str, str, str]] = []
    replay(cluster, RECORDING, lambda c, o: seen.append(_key(c, o)), order="duplicated")
    once = [_key(c, o) for c, o in recorded_changes(RECORDING)]
    assert seen == [k for k in once for _ in (1, 2)]


def test_shuffled_makes_every_change_first_then_delivers_in_a_seeded_order(
        tmp_path: Path) -> None:
    runs = []
    for seed in (1, 1, 2):
        cluster = LocalCluster([REPO / "crds"])
        try:
            states: list[set[tuple[str, str, str]]] = []
            seen: list[tuple[str, str, str, str]] = []

            def deliver(change: str, obj: Obj, cluster: LocalCluster = cluster,
                        states: list = states, seen: list = seen) -> None:
                states.append(_state(cluster))
                seen.append(_key(change, obj))

            replay(cluster, RECORDING, deliver, order="shuffled", seed=seed)
            final = _state(cluster)
        finally:
            cluster.close()
        assert all(state == final for state in states)  # the world had all changes already
        runs.append(seen)
    in_order = [_key(c, o) for c, o in recorded_changes(RECORDING)]
    assert Counter(runs[0]) == Counter(in_order) and runs[0] != in_order
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_an_unknown_order_is_refused(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="in_order, shuffled, duplicated"):
        replay(cluster, RECORDING, lambda c, o: None, order="random")


def test_a_missing_crd_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no CRD file at"):
        LocalCluster([tmp_path / "nope.yaml"])
