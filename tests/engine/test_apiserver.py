"""The engine's writes against the local API server (eventop.engine.apiserver.KubeWriter)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine.apiserver import Echoes, KubeWriter
from eventop.engine.controller import APPLIED_ANNOTATION, PARENT_UID_LABEL
from eventop.engine.desired import Child
from eventop.kube import Kube, NotFound
from eventop.kube.errors import Invalid
from eventop.kube.informer import Cache
from tests.engine.stricter_crd import parent_refused_by_a_stricter_crd

Obj = dict[str, Any]


def test_removing_a_finalizer_from_a_parent_already_gone_is_done_not_a_failure(
        kube: Kube) -> None:
    """A run that read its parent from a cache that had not yet seen an earlier run remove
    the last finalizer (and the API server delete the parent) finds it gone: done."""
    parent: Any = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "held", "namespace": "default", "finalizers": ["eventop.dev/test"]}})
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    current = writer.set_finalizer(parent, "eventop.dev/test", False)
    kube.delete("v1", "ConfigMap", "held", "default")
    assert kube.get_or_none("v1", "ConfigMap", "held", "default") is None
    assert writer.set_finalizer(parent, "eventop.dev/test", False) is parent
    assert current["metadata"].get("finalizers") is None
    with pytest.raises(NotFound):  # adding one to a parent that is gone is no success
        writer.set_finalizer(parent, "eventop.dev/test", True)


def test_the_last_finalizer_removed_never_puts_the_deleted_parent_back_in_the_cache(
        kube: Kube) -> None:
    """The API server deletes a parent when its last finalizer goes; its informer may see
    that before the write's answer comes back. Written through, the answer would bring the
    parent back into the cache (for good: no event ever removes it again)."""
    from eventop.kube.informer import InformerSpec
    from eventop.testing import wait_until

    cache = Cache(kube, [InformerSpec("v1", "ConfigMap")]).start()
    try:
        assert cache.wait_synced(10)
        kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "held", "namespace": "default", "finalizers": ["eventop.dev/test"]}})
        kube.delete("v1", "ConfigMap", "held", "default")
        store = cache.store("v1", "ConfigMap")
        assert store is not None
        assert wait_until(lambda: (store.get("default", "held") or {}).get(
            "metadata", {}).get("deletionTimestamp"), 10)
        parent = store.get("default", "held")

        class SeenGoneFirst:
            """The informer handles the delete before the answer arrives."""

            def __getattr__(self, name: str) -> Any:
                return getattr(kube, name)

            def patch(self, *args: Any, **kwargs: Any) -> Any:
                answer = kube.patch(*args, **kwargs)
                assert wait_until(lambda: store.get("default", "held") is None, 10)
                return answer

        writer = KubeWriter(SeenGoneFirst(), cache, Echoes())  # type: ignore[arg-type]
        writer.set_finalizer(parent, "eventop.dev/test", False)
        assert kube.get_or_none("v1", "ConfigMap", "held", "default") is None
        assert store.get("default", "held") is None
    finally:
        cache.stop()


def test_a_child_changed_since_the_cache_read_it_is_not_deleted_and_the_run_is_repeated(
        kube: Kube) -> None:
    """A run planned from a cache that had not seen a user take a copy over (its
    ownerReference removed) would delete the user's object: the delete carries the version
    it was planned from, the API server refuses it, and the run is repeated."""
    from eventop.engine.desired import Child
    from eventop.engine.plan import Action, Plan
    from eventop.engine.write import execute

    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "rule", "uid": "rule-uid",
           "controller": True}
    read = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "copy", "namespace": "default", "ownerReferences": [ref]},
        "data": {"v": "1"}})
    kube.replace({**read, "metadata": {**read["metadata"], "ownerReferences": []},
                  "data": {"v": "taken"}})  # taken over after the cache read it
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    plan = Plan([Action("delete", "ConfigMap", "default", "copy", None, read,
                        Child(read))])
    outcome = execute(plan, writer, {"metadata": {"uid": "rule-uid"}})
    assert outcome.retry and [e.status for e in outcome.errors] == [409]
    assert kube.get("v1", "ConfigMap", "copy", "default")["data"] == {"v": "taken"}


def test_a_write_refused_with_409_learns_what_refused_it_from_the_cache_not_a_read(
        local_kube: Any, kube: Kube) -> None:
    """Another replica created the object, or updated it, just before this one: the cache
    gets that version by its watch, so the engine settles the conflict without asking the
    API server; an object the cache can not see is read as before."""
    from eventop.kube.informer import InformerSpec

    cache = Cache(kube, [InformerSpec("v1", "ConfigMap")]).start()
    try:
        assert cache.wait_synced(10)
        writer = KubeWriter(kube, cache, Echoes())
        theirs = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "made", "namespace": "default"}, "data": {"v": "1"}})
        start = len(local_kube.requests)
        ours = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "made", "namespace": "default"}, "data": {"v": "1"}}
        found = writer.read_after_conflict(ours, None)  # a create found the name taken
        assert found is not None and found["metadata"]["uid"] == theirs["metadata"]["uid"]
        newer = kube.replace({**theirs, "data": {"v": "2"}})
        found = writer.read_after_conflict(ours, theirs["metadata"]["resourceVersion"])
        assert found is not None
        assert found["metadata"]["resourceVersion"] == newer["metadata"]["resourceVersion"]
        asked = [(m, p) for m, p, q, *_ in local_kube.requests[start:] if "watch=true" not in q]
        assert asked == [("PUT", "/api/v1/namespaces/default/configmaps/made")]  # the update

        secret = {"apiVersion": "v1", "kind": "Secret",
                  "metadata": {"name": "uncached", "namespace": "default"}}
        kube.create(secret)
        start = len(local_kube.requests)
        assert writer.read_after_conflict(secret, None) is not None  # no informer: a read
        assert [m for m, *_ in local_kube.requests[start:]] == ["GET"]
    finally:
        cache.stop()


def configmap(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "child", "namespace": "default"}, "data": data}


def managers(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["manager"], m["operation"]) for m in obj["metadata"].get("managedFields") or []]


def test_what_a_create_wrote_is_handed_to_the_apply_before_the_first_so_it_removes_it(
        kube: Kube) -> None:
    """A POST's fields belong to an Update entry, which no apply ever removes from: a key
    the handler stopped wanting (a port, an environment variable) would stay for good."""
    from eventop.engine.desired import Child
    from eventop.engine.plan import Action, Plan, prepare
    from eventop.engine.write import execute

    echoes = Echoes()
    writer = KubeWriter(kube, Cache(kube, []), echoes)
    parent = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "owner", "namespace": "default"}})

    def write(obj: Obj, existing: Obj | None) -> Obj:  # as the engine writes a child
        child = Child(obj)
        done = execute(Plan([Action("apply" if existing else "create", "ConfigMap",
                                    "default", "child", prepare(child, parent), existing,
                                    child)]), writer, parent)
        return (done.created or done.updated)[0]

    created = write(configmap(a="1", b="2"), None)
    assert managers(created) == [(kube.field_manager, "Update")]
    applied = write(configmap(a="1"), created)
    assert applied["data"] == {"a": "1"}
    assert managers(applied) == [(kube.field_manager, "Apply")]
    assert list(applied["metadata"]["annotations"]) == [APPLIED_ANNOTATION]
    uid, rv = applied["metadata"]["uid"], int(applied["metadata"]["resourceVersion"])
    assert echoes.is_echo(uid, str(rv - 1), "update")  # the hand-over's own write


def test_a_child_applied_before_is_applied_without_a_read(kube: Kube, local_kube: Any) -> None:
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    created = writer.create(configmap(a="1"))
    first = writer.apply({**configmap(a="1", b="2"), "metadata": {
        **configmap()["metadata"], "annotations": {APPLIED_ANNOTATION: "h1"}}},
        force=False, existing=created)
    start = len(local_kube.requests)
    writer.apply({**configmap(a="1"), "metadata": {
        **configmap()["metadata"], "annotations": {APPLIED_ANNOTATION: "h2"}}},
        force=False, existing=first)
    assert [r[0] for r in local_kube.requests[start:]] == ["PATCH"]
    assert kube.get("v1", "ConfigMap", "child", "default")["data"] == {"a": "1"}


def test_the_very_write_refused_moments_ago_is_refused_again_without_asking(
        kube: Kube, local_kube: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event about a child or its parent runs the parent: each run sent the same
    refused write again (22 in three minutes for one immutable field, on a real server)."""
    from eventop.engine import apiserver

    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    created = writer.create({**configmap(a="1"), "immutable": True})
    changed = {**configmap(a="2"), "immutable": True}
    with pytest.raises(Invalid, match="immutable"):
        writer.apply(changed, force=True, existing=created)
    start = len(local_kube.requests)
    with pytest.raises(Invalid, match="immutable"):
        writer.apply(changed, force=True, existing=created)
    assert local_kube.requests[start:] == []
    another = {**configmap(a="3"), "immutable": True}  # another write: asked
    with pytest.raises(Invalid):
        writer.apply(another, force=True, existing=created)
    assert len(local_kube.requests) > start
    monkeypatch.setattr(apiserver, "REFUSAL_TTL", 0.0)  # refusals forgotten at once
    fourth = {**configmap(a="4"), "immutable": True}
    with pytest.raises(Invalid):
        writer.apply(fourth, force=True, existing=created)
    start = len(local_kube.requests)
    with pytest.raises(Invalid):
        writer.apply(fourth, force=True, existing=created)
    assert local_kube.requests[start:]


def test_a_patch_of_an_object_changed_since_the_cache_read_it_is_not_sent_and_is_retried(
        kube: Kube) -> None:
    """A patch of someone else's object (a PersistentVolume's reclaim policy) carries the
    version it was planned from: changed meanwhile, it is refused and the run repeated;
    on the current version it sets exactly its field."""
    from eventop.engine.plan import Action, Plan
    from eventop.engine.write import execute

    read = kube.create({"apiVersion": "v1", "kind": "PersistentVolume",
                        "metadata": {"name": "pv-a"},
                        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                 "persistentVolumeReclaimPolicy": "Delete",
                                 "csi": {"driver": "disk.csi.example.com", "volumeHandle": "a"}}})
    changed = kube.patch("v1", "PersistentVolume", "pv-a", None,
                         {"metadata": {"labels": {"tier": "gold"}}})
    patch = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-a"},
             "spec": {"persistentVolumeReclaimPolicy": "Retain"}}
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    stale = execute(Plan([Action("patch", "PersistentVolume", "", "pv-a", patch, read)]),
                    writer, {"metadata": {"uid": "db-uid"}})
    assert stale.retry and [e.status for e in stale.errors] == [409]
    assert kube.get("v1", "PersistentVolume", "pv-a")["spec"][
        "persistentVolumeReclaimPolicy"] == "Delete"
    done = execute(Plan([Action("patch", "PersistentVolume", "", "pv-a", patch, changed)]),
                   writer, {"metadata": {"uid": "db-uid"}})
    pv = kube.get("v1", "PersistentVolume", "pv-a")
    assert [o["metadata"]["name"] for o in done.updated] == ["pv-a"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["metadata"]["labels"] == {"tier": "gold"}
    assert pv["spec"]["csi"] == {"driver": "disk.csi.example.com", "volumeHandle": "a"}


def test_a_finalizer_write_that_loses_a_race_reads_the_parent_again_instead_of_failing(
        kube: Kube) -> None:
    """Two router replicas: the other one patched the parent's status between this one's
    read and its finalizer patch (a 409 on the resourceVersion precondition). That run
    failed, with a Warning Event, on every second new Database."""
    parent: Any = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "raced", "namespace": "default"}})
    kube.patch("v1", "ConfigMap", "raced", "default", {"data": {"other": "replica"}})
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    written = writer.set_finalizer(parent, "eventop.dev/test", True)  # read before the patch
    assert written["metadata"]["finalizers"] == ["eventop.dev/test"]
    assert written["data"] == {"other": "replica"}
    kube.patch("v1", "ConfigMap", "raced", "default", {"data": {"again": "1"}})
    assert writer.set_finalizer(written, "eventop.dev/test", False)["metadata"].get(
        "finalizers") is None


def test_a_finalizer_not_yet_added_to_a_parent_deleted_meanwhile_is_no_failure(
        kube: Kube) -> None:
    """Deleted right after it was made: the run read it before its deletion, its finalizer
    patch loses the race (409), and the fresh read is being deleted. The API server takes
    no new finalizer then (422): the run must see the parent going, not fail with a
    ReconcileFailed Warning on an object that simply goes away. (Also run against the
    real API server by ``test_cluster.py``.)"""
    finalizer_on_a_parent_deleted_meanwhile(kube, "default")


def finalizer_on_a_parent_deleted_meanwhile(kube: Kube, ns: str) -> None:
    parent: Any = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "short-lived", "namespace": ns, "finalizers": ["other.example/keep"]}})
    try:
        kube.delete("v1", "ConfigMap", "short-lived", ns)
        writer = KubeWriter(kube, Cache(kube, []), Echoes())
        seen = writer.set_finalizer(parent, "eventop.dev/test", True)
        assert seen["metadata"]["deletionTimestamp"]
        assert seen["metadata"]["finalizers"] == ["other.example/keep"]
        live = kube.get("v1", "ConfigMap", "short-lived", ns)
        with pytest.raises(Invalid, match="no new finalizers can be added if the object is "
                           r'being deleted, found new finalizers \[\]string\{"a/b"\}'):
            kube.patch("v1", "ConfigMap", "short-lived", ns,
                       {"metadata": {"finalizers": [*live["metadata"]["finalizers"], "a/b"]}})
    finally:
        kube.patch("v1", "ConfigMap", "short-lived", ns, {"metadata": {"finalizers": None}})


def test_a_recreated_child_still_held_by_a_finalizer_is_made_again_later_not_refused(
        kube: Kube) -> None:
    """An immutable copy whose data changed is deleted and made again; someone's finalizer
    keeps the old one a while. Its create finds the name taken by an object that is going:
    the run is repeated later (a stale write), not an update refused as a WriteRefused
    error in the rule's status. (Also run against the real API server.)"""
    recreate_of_a_child_held_by_a_finalizer(kube, "default")


def test_a_child_held_by_a_finalizer_is_not_gone_when_deleted_so_its_going_is_no_echo(
        kube: Kube) -> None:
    """A copy held by someone's finalizer only got a deletionTimestamp from the engine's
    delete; it goes when they remove the finalizer. That disappearance was taken for the
    echo of the delete and dropped, so the rule that wanted the copy back (its run had
    skipped the terminating one) heard nothing and the copy stayed missing until the next
    resync, minutes later, with the rule Ready (found on a real API server)."""
    held = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": "1"},
                        "metadata": {"name": "held-going", "namespace": "default",
                                     "finalizers": ["other.example/keep"]}})
    free = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": "1"},
                        "metadata": {"name": "free-going", "namespace": "default"}})
    echoes = Echoes()
    writer = KubeWriter(kube, Cache(kube, []), echoes)
    try:
        writer.delete(held)
        writer.delete(free)
        going = kube.get("v1", "ConfigMap", "held-going", "default")["metadata"]
        assert going["deletionTimestamp"]
        assert not echoes.is_echo(held["metadata"]["uid"], None, "delete", consume=False)
        # the change that set its deletionTimestamp is ours (the answer, written through)
        assert echoes.is_echo(going["uid"], going["resourceVersion"], "update", consume=False)
        assert echoes.is_echo(free["metadata"]["uid"], None, "delete", consume=False)
    finally:
        kube.patch("v1", "ConfigMap", "held-going", "default", {"metadata": {"finalizers": None}})


def recreate_of_a_child_held_by_a_finalizer(kube: Kube, ns: str) -> None:
    from eventop.engine.plan import Action, Plan
    from eventop.engine.write import execute

    old = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
                       "data": {"v": "1"},
                       "metadata": {"name": "held-copy", "namespace": ns,
                                    "finalizers": ["other.example/keep"],
                                    "labels": {PARENT_UID_LABEL: "rule-uid"}}})
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True, "data": {"v": "2"},
               "metadata": {"name": "held-copy", "namespace": ns,
                            "labels": {PARENT_UID_LABEL: "rule-uid"}}}
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    try:
        done = execute(Plan([Action("recreate", "ConfigMap", ns, "held-copy", desired, old,
                                    Child(desired, mode="replace"))]),
                       writer, {"metadata": {"uid": "rule-uid"}})
        assert done.retry
        assert [e.reason for e in done.errors] == ["StaleWrite"]
        assert "still being deleted" in done.errors[0].message
    finally:
        kube.patch("v1", "ConfigMap", "held-copy", ns, {"metadata": {"finalizers": None}})


def test_a_replace_that_lost_a_race_never_writes_its_older_view_over_the_winner(
        kube: Kube) -> None:
    """Two router replicas, a source changed twice in a burst: the replica whose run read
    the older source finds the copy changed by the other (409). Writing its view again on
    the fresh copy put older data back for a moment (a reviewer saw copies go 2, 4, 2, 4);
    now the run is repeated on a fresh view instead."""
    from eventop.engine.plan import Action, Plan
    from eventop.engine.write import execute

    read = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": "1"},
                        "metadata": {"name": "raced-copy", "namespace": "default",
                                     "labels": {PARENT_UID_LABEL: "rule-uid"}}})
    kube.replace({**read, "data": {"v": "4"}})  # the other replica, from the newer source
    older = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": "2"},
             "metadata": {"name": "raced-copy", "namespace": "default",
                          "labels": {PARENT_UID_LABEL: "rule-uid"}}}
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    done = execute(Plan([Action("update", "ConfigMap", "default", "raced-copy", older, read,
                                Child(older, mode="replace"))]),
                   writer, {"metadata": {"uid": "rule-uid"}})
    assert done.retry and [e.reason for e in done.errors] == ["StaleWrite"]
    assert kube.get("v1", "ConfigMap", "raced-copy", "default")["data"] == {"v": "4"}


def test_two_replicas_running_one_change_write_its_status_and_events_once(kube: Kube) -> None:
    """Both router replicas run the same change (the leader from its watch, the other from
    the watcher's event) from the same version of the parent. The second status write
    finds the parent changed (409) and the status already there: no second write, and the
    change's Event is not posted again (every lifecycle Event had count 2)."""
    from eventop.engine import Controller, Desired, Key, Note
    from eventop.engine.reads import Reads
    from eventop.engine.run import run
    from eventop.handlers import Registry

    ctl = Controller("rates-once", parent="eventop.dev/v1/ExchangeRate", registry=Registry())
    ctl.reconcile(lambda cr, reads: Desired(status={"rate": "1.0812"},
                                            events=[Note("Normal", "RateFetched", "1.0812")]))
    read = kube.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                        "metadata": {"name": "usd-once", "namespace": "default"},
                        "spec": {"base": "EUR", "currency": "USD"}})
    replicas = [KubeWriter(kube.for_manager(f"eventop-rates-{i}"), Cache(kube, []), Echoes())
                for i in (1, 2)]
    results = [run(ctl, Key("default", "usd-once"), read,
                   Reads(lambda *_: None, ctl.kinds(), ctl.name, read), writer)
               for writer in replicas]
    assert [r.status_written for r in results] == [True, False]
    assert not results[1].retry
    events = [e for e in kube.list("v1", "Event", "default")
              if e["involvedObject"]["name"] == "usd-once"]
    assert [(e["reason"], e.get("count")) for e in events] == [("RateFetched", 1)]
    assert kube.get("eventop.dev/v1", "ExchangeRate", "usd-once", "default")["status"] == {
        "rate": "1.0812"}


def test_a_status_worked_out_from_an_older_parent_is_not_written_over_a_newer_one(
        kube: Kube) -> None:
    from eventop.engine import Controller, Desired, Key
    from eventop.engine.reads import Reads
    from eventop.engine.run import run
    from eventop.handlers import Registry

    ctl = Controller("rates-behind", parent="eventop.dev/v1/ExchangeRate", registry=Registry())
    ctl.reconcile(lambda cr, reads: Desired(status={"rate": "0.9"}))
    read = kube.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                        "metadata": {"name": "usd-behind", "namespace": "default"},
                        "spec": {"base": "EUR", "currency": "USD"}})
    kube.patch_status(read, {"rate": "1.1"})  # the other replica, from a newer answer
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    result = run(ctl, Key("default", "usd-behind"), read,
                 Reads(lambda *_: None, ctl.kinds(), ctl.name, read), writer)
    assert result.retry and not result.status_written  # run again, on the newer parent
    assert kube.get("eventop.dev/v1", "ExchangeRate", "usd-behind", "default")["status"] == {
        "rate": "1.1"}


def test_a_parent_its_crd_no_longer_accepts_gets_one_warning_saying_why_nothing_is_written(
        kube: Kube) -> None:
    """A CRD made stricter after a parent was stored: the API server (v1.24, as the real one
    does: tests/engine/test_cluster.py runs the same) checks the whole object on a status
    write too, so every run's status write was refused, with nothing but ERROR lines in the
    router's log (an upgrade trial: 307 refusals a minute, the status frozen)."""
    parent_refused_by_a_stricter_crd(kube, "example.com", "default")
