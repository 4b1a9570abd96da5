"""The informer's store: what a (re)list and watch events leave in it, and what it remembers
of changes (when it learned them, deletions, lost controllers)."""

from __future__ import annotations

from typing import Any

from eventop.kube.store import Store


def cm(name: str, rv: int, uid: str | None = None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                            "resourceVersion": str(rv)}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                                    "name": owner, "uid": owner, "controller": True}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def test_a_watch_event_older_than_what_the_store_holds_is_ignored() -> None:
    store = Store("v1", "ConfigMap")
    store.put(cm("a", 5))
    store.put(cm("a", 3))
    assert store.get("ns", "a")["metadata"]["resourceVersion"] == "5"
    assert store.put_if_newer(cm("a", 5)) is False  # our own write's answer, already held
    assert store.put_if_newer(cm("a", 6)) is True


def test_a_relist_keeps_nothing_of_objects_gone_meanwhile_and_records_their_deletion() -> None:
    store = Store("v1", "ConfigMap")
    store.replace_all([cm(f"c{i}", 10 + i) for i in range(50)], "60")
    store.replace_all([cm("c0", 10)], "100")  # a 410, then the list: 49 deleted meanwhile
    assert [o["metadata"]["name"] for o in store.list()] == ["c0"]
    assert set(store._learned) == {("ns", "c0")}  # nothing kept for what is gone
    assert store.learned_at(cm("c7", 17), deleted=True) is not None
    assert store.learned_at(cm("c0", 10), deleted=True) is None
    assert store.resource_version == "100"


def test_a_relist_leaves_an_unchanged_object_as_it_was_learned() -> None:
    store = Store("v1", "ConfigMap")
    store.replace_all([cm("a", 10)], "10")
    learned = store.learned_at(cm("a", 10))
    store.replace_all([cm("a", 10)], "20")
    assert store.learned_at(cm("a", 10)) == learned
    store.replace_all([cm("a", 15)], "30")
    assert store.learned_at(cm("a", 15)) > learned  # type: ignore[operator]
    assert store.learned_at(cm("a", 10), "10") == learned  # history kept for the same uid


def test_a_relist_finds_a_name_made_again_as_a_deletion_of_the_old_uid() -> None:
    store = Store("v1", "ConfigMap")
    store.replace_all([cm("a", 10, uid="old", owner="rule-1")], "10")
    store.replace_all([cm("a", 20, uid="new")], "20")
    assert store.get("ns", "a")["metadata"]["uid"] == "new"
    assert store.learned_at(cm("a", 10, uid="old"), deleted=True) is not None
    assert store.list(owner="rule-1") == []
    assert store.former_owner("new") is None  # a new object lost nothing


def test_a_relist_remembers_the_controller_an_object_lost_while_unwatched() -> None:
    """The former owner's reconcile must still learn it lost a child, as a watch event
    would have told it."""
    store = Store("v1", "ConfigMap")
    store.replace_all([cm("a", 10, owner="rule-1")], "10")
    store.replace_all([cm("a", 20)], "20")
    assert store.former_owner("uid-a")["uid"] == "rule-1"
    assert store.list(owner="rule-1") == []
