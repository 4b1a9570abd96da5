"""The engine as the router runs it, against the local API server over HTTP: its cache (a
real list+watch), its queue, and what each event costs."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eventop.engine import Controller, Desired, Key, Note
from eventop.engine.catchup import CacheBehind
from eventop.engine.queue import Result, Ticket, WorkQueue
from eventop.engine.runtime import MAX_FOLLOWUPS, Engine
from eventop.engine.settings import EngineSettings
from eventop.handlers.events import Event, InvalidEvent
from eventop.handlers.registry import Registry
from eventop.testing.waiting import wait_until

Obj = dict[str, Any]
NS = "teams"


def cm(name: str, data: Obj | None = None, **meta: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NS, **meta}, "data": dict(data or {})}


class Counting:
    """A controller over ConfigMaps labelled ``team``: each one wants a ``<name>-copy``
    ConfigMap; its runs are counted and can be held to see what arrives meanwhile."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.started = threading.Event()
        self.ctl = Controller("counting", parent="v1/ConfigMap", owns=["v1/Secret"],
                              registry=Registry(), module="tests.engine")
        self.ctl.reconcile(self.reconcile)

    def reconcile(self, parent: Obj, reads: Any) -> Desired:
        if parent["metadata"]["name"] == "kube-root-ca.crt":  # every namespace has one
            return Desired()
        self.runs.append(parent["metadata"]["name"])
        self.started.set()
        assert self.hold.wait(30)
        name = parent["metadata"]["name"]
        return Desired([{"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": f"{name}-copy", "namespace": NS},
                         "stringData": {"v": (parent.get("data") or {}).get("v", "")}}],
                       status=None, events=[Note("Normal", "Seen", "a run")])


@pytest.fixture
def counting() -> Counting:
    return Counting()


def started_engine(local_kube: Any, kube: Any, counting: Counting,
                   run_on_watch: bool) -> Engine:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    eng = Engine([counting.ctl], kube, settings=EngineSettings(workers=2, cache_wait=5.0,
                                                               run_on_watch=run_on_watch))
    eng.start()
    assert wait_until(lambda: eng.readiness()[0], 20), eng.readiness()
    assert eng.started.wait(20) and wait_until(eng.queue.idle, 20)  # first runs done
    return eng


@pytest.fixture
def engine(local_kube: Any, kube: Any, counting: Counting) -> Iterator[Engine]:
    """Runs started by events only: what each event costs, counted exactly."""
    eng = started_engine(local_kube, kube, counting, run_on_watch=False)
    yield eng
    eng.stop()


@pytest.fixture
def watching(local_kube: Any, kube: Any, counting: Counting) -> Iterator[Engine]:
    """The router's default: runs started by the cache's own watch too."""
    eng = started_engine(local_kube, kube, counting, run_on_watch=True)
    yield eng
    eng.stop()


def test_a_change_the_routers_watch_sees_starts_its_run_before_any_event(
        watching: Engine, local_kube: Any, counting: Counting) -> None:
    counting.hold.clear()
    local_kube.put(cm("w", {"v": "1"}))
    assert counting.started.wait(10)  # no event sent: the router's own watch started it
    # the watcher's event about that change, arriving while the run is under way: it is
    # answered by that run, which started after the cache held the change
    ticket = submit(watching, "add", local_kube.get("v1", "ConfigMap", "w", NS))
    assert not ticket.wait(0.2)
    counting.hold.set()
    assert ticket.wait(20) and ticket.results[("counting", Key(NS, "w"))].ok
    assert counting.runs == ["w"]
    assert local_kube.get("v1", "Secret", "w-copy", NS)["data"]["v"] == "MQ=="  # "1"


def test_the_first_event_of_a_change_the_watch_acted_on_costs_no_run_a_resync_does(
        watching: Engine, local_kube: Any, counting: Counting) -> None:
    obj = local_kube.put(cm("r", {"v": "1"}))
    assert wait_until(lambda: local_kube.get("v1", "Secret", "r-copy", NS) is not None, 20)
    assert wait_until(watching.queue.idle, 20) and counting.runs == ["r"]
    assert submit(watching, "add", obj).wait(20)  # its event, after that run ended
    assert counting.runs == ["r"]
    assert submit(watching, "add", obj).wait(20)  # the same again: a resync, a run
    assert counting.runs == ["r", "r"]


def test_without_runs_from_the_watch_only_events_start_runs(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    obj = local_kube.put(cm("quiet", {"v": "1"}))
    informer = engine.cache.informer("v1", "ConfigMap")
    assert informer is not None and wait_until(lambda: informer.holds(obj), 10)
    time.sleep(0.3)
    assert counting.runs == []
    assert engine.submit(Event.for_object("add", obj))[0].wait(20)
    assert counting.runs == ["quiet"]


def test_of_several_replicas_only_the_lease_holders_watch_starts_runs(
        local_kube: Any, kube: Any) -> None:
    """Two routers electing a leader: a change is run once, by the leader, from its watch;
    an event sent to the other still gets its run there; when the leader stops, it hands
    the lease over, the other runs every parent once and its watch starts the runs."""
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    settings = EngineSettings(workers=1, cache_wait=5.0, leader_elect=True,
                              lease_timing=(2.0, 1.2, 0.1))
    counts = [Counting(), Counting()]
    engines = [Engine([c.ctl], kube, settings=settings).start() for c in counts]
    try:
        for eng in engines:
            assert wait_until(lambda eng=eng: eng.readiness()[0], 20) and eng.started.wait(20)
        assert wait_until(lambda: any(e.elector and e.elector.is_leader for e in engines), 10)
        lead = next(i for i, e in enumerate(engines) if e.elector and e.elector.is_leader)
        leader, follower = engines[lead], engines[1 - lead]
        assert follower.elector is not None and not follower.elector.is_leader
        holder = local_kube.get("coordination.k8s.io/v1", "Lease", "eventop-router",
                                "default")["spec"]["holderIdentity"]
        assert leader.elector is not None and holder == leader.elector.identity

        obj = local_kube.put(cm("once", {"v": "1"}))
        assert wait_until(lambda: counts[lead].runs == ["once"], 10)  # no event sent
        informer = follower.cache.informer("v1", "ConfigMap")
        assert informer is not None and wait_until(lambda: informer.holds(obj), 10)
        time.sleep(0.3)
        assert counts[1 - lead].runs == []  # the follower's watch saw it and left it
        assert submit(follower, "add", obj).wait(20)  # its event, sent to the follower
        assert counts[1 - lead].runs == ["once"]

        leader.stop()  # hands the lease back on the way out
        assert wait_until(lambda: follower.elector.is_leader, 10)
        # taking the lease, it runs every parent once: what its watch saw while the other
        # led, and that one may not have run before it went
        assert wait_until(lambda: counts[1 - lead].runs == ["once", "once"], 10)
        local_kube.put(cm("after", {"v": "2"}))
        assert wait_until(lambda: counts[1 - lead].runs == ["once", "once", "after"], 10)
    finally:
        for eng in engines:
            eng.stop()


def submit(engine: Engine, change: str, obj: Obj) -> Ticket:
    ticket, _notes = engine.submit(Event.for_object(change, obj))
    return ticket


def requests_since(local_kube: Any, start: int) -> list[tuple[str, str]]:
    """What the engine asked the API server, its cache's watches aside."""
    return [(r[0], r[1]) for r in local_kube.requests[start:] if "watch=true" not in r[2]]


def test_n_events_for_one_key_during_a_run_cost_one_more_run(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    first = local_kube.put(cm("a", {"v": "1"}))
    counting.hold.clear()
    ticket = submit(engine, "add", first)
    assert counting.started.wait(10)  # the first run is under way, held
    later = []
    for i in range(2, 12):  # ten changes while it runs
        later.append(submit(engine, "update", local_kube.put(cm("a", {"v": str(i)}))))
    assert not ticket.wait(0.2) and not any(t.wait(0) for t in later)
    counting.hold.set()
    assert ticket.wait(20) and all(t.wait(20) for t in later)
    assert counting.runs == ["a", "a"]  # the held run, then one for all ten
    assert local_kube.get("v1", "Secret", "a-copy", NS)["data"]["v"] == "MTE="  # "11": last
    assert engine.queue.merged >= 9


def test_an_event_is_answered_after_a_run_that_started_after_it(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    obj = local_kube.put(cm("b", {"v": "1"}))
    counting.hold.clear()
    first = submit(engine, "add", obj)
    assert counting.started.wait(10)
    second = submit(engine, "update", local_kube.put(cm("b", {"v": "2"})))
    counting.hold.set()
    assert first.wait(20)
    assert second.wait(20)
    assert counting.runs == ["b", "b"]  # the run under way did not answer the second event
    assert local_kube.get("v1", "Secret", "b-copy", NS)["data"]["v"] == "Mg=="  # "2"


def test_the_echo_of_an_own_write_costs_no_run_and_no_request(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    parent = local_kube.put(cm("c", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    assert counting.runs == ["c"]
    child = local_kube.get("v1", "Secret", "c-copy", NS)
    start, runs = len(local_kube.requests), engine.queue.started
    ticket, notes = engine.submit(Event.for_object("add", child))
    assert ticket.wait(5)
    assert notes == {"counting": "echo of its own write"}
    assert engine.queue.started == runs and counting.runs == ["c"]
    assert requests_since(local_kube, start) == []
    # a change by someone else (another resourceVersion) is no echo: the child is restored
    local_kube.put({**child, "data": {"v": "aGFuZA=="}})
    changed = local_kube.get("v1", "Secret", "c-copy", NS)
    assert submit(engine, "update", changed).wait(20)
    assert counting.runs == ["c", "c"]


def test_a_child_blocked_by_someone_elses_object_is_made_once_it_is_gone_without_any_event(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """Deleting the squatter sends no event this handler maps to its parent (the object was
    never its child): before, the parent stayed stuck until its spec changed."""
    local_kube.put({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "s-copy", "namespace": NS}, "stringData": {"v": "x"}})
    parent = local_kube.put(cm("s", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    assert "ownerReferences" not in local_kube.get("v1", "Secret", "s-copy", NS)["metadata"]
    local_kube.remove("v1", "Secret", "s-copy", NS)
    assert wait_until(lambda: (local_kube.get("v1", "Secret", "s-copy", NS) or {})
                      .get("metadata", {}).get("ownerReferences"), 20)
    assert counting.runs.count("s") >= 2


@pytest.mark.parametrize(("seen_before", "runs"), [(True, ["f", "f"]), (None, ["f"])])
def test_a_status_decided_before_the_writes_is_looked_at_again_after_them(
        engine: Engine, local_kube: Any, counting: Counting, seen_before: bool | None,
        runs: list[str]) -> None:
    """A Database's status said "backups not scheduled" for the CronJob its own run had
    just created, until the next resync (28 s in the demo): its writes' echoes start no
    run, so the run that wrote must be followed by one that sees them."""
    plain = counting.reconcile

    def reconcile(parent: Obj, reads: Any) -> Desired:
        desired = plain(parent, reads)
        for child in desired.children:  # as the API server keeps it: in sync once written
            text = child.pop("stringData")["v"]  # type: ignore[union-attr]
            child["data"] = {"v": base64.b64encode(text.encode()).decode()}  # type: ignore[index]
        desired.status = lambda outcome: None  # (a ConfigMap parent has no status)
        desired.status_seen_before_writes = seen_before
        return desired

    counting.ctl.reconcile_fn = reconcile
    assert submit(engine, "add", local_kube.put(cm("f", {"v": "1"}))).wait(20)
    assert wait_until(engine.queue.idle, 20)
    assert counting.runs == runs


def test_the_event_of_a_change_the_watch_acted_on_is_not_quiet_when_a_follow_up_ran_last(
        watching: Engine, local_kube: Any, counting: Counting) -> None:
    """The watch's run wrote, and the run that followed it (its status was decided before
    its writes) wrote nothing: the change's event, taking the last run's result, still
    reports work done (not a resync's debug line; the example's own test once missed the
    router's line for a new site so)."""
    plain = counting.reconcile

    def reconcile(parent: Obj, reads: Any) -> Desired:
        desired = plain(parent, reads)
        for child in desired.children:  # as the API server keeps it: in sync once written
            text = child.pop("stringData")["v"]  # type: ignore[union-attr]
            child["data"] = {"v": base64.b64encode(text.encode()).decode()}  # type: ignore[index]
        desired.status = lambda outcome: None
        desired.status_seen_before_writes = True
        desired.events = []  # (Counting's Event every run would make no run quiet)
        return desired

    counting.ctl.reconcile_fn = reconcile
    obj = local_kube.put(cm("w", {"v": "1"}))
    assert wait_until(lambda: counting.runs == ["w", "w"] and watching.queue.idle(), 20)
    ticket = submit(watching, "add", obj)  # its event, after both runs ended
    assert ticket.wait(20) and counting.runs == ["w", "w"]
    assert not ticket.results[("counting", Key(NS, "w"))].quiet


def test_the_deletion_of_the_object_blocking_a_child_runs_its_parent_at_once(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """Not only when the backoff of its retries comes round, 5 minutes apart after a while:
    the run's conflict names the object whose change is the parent's business."""
    squatter = local_kube.put({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "q-copy", "namespace": NS},
                               "stringData": {"v": "x"}})
    parent = local_kube.put(cm("q", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    local_kube.remove("v1", "Secret", "q-copy", NS)
    ticket, _ = engine.submit(Event.for_object("delete", squatter))
    assert ticket.wait(20)
    assert ticket.results[("counting", Key(NS, "q"))].ok
    assert (local_kube.get("v1", "Secret", "q-copy", NS) or {}).get(
        "metadata", {}).get("ownerReferences")
    assert engine._squatters == {}  # made: no longer anybody's business


def test_an_object_in_the_way_that_is_being_deleted_runs_its_parent_when_it_is_gone(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """Its deletion first shows as an update with a deletionTimestamp (a finalizer holds
    it, or a namespace terminates): that run skips the child, and it was then no longer
    remembered, so the final delete ran nobody and the parent stayed without its child (a
    TeamNamespace whose namespace another one had held, until the router restarted)."""
    squatter = local_kube.put({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "h-copy", "namespace": NS,
                                            "finalizers": ["example.com/hold"]},
                               "stringData": {"v": "x"}})
    parent = local_kube.put(cm("h", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    local_kube.remove("v1", "Secret", "h-copy", NS)
    held = local_kube.get("v1", "Secret", "h-copy", NS)
    assert held is not None and held["metadata"].get("deletionTimestamp")
    informer = engine.cache.informer("v1", "Secret")
    assert informer is not None and wait_until(lambda: informer.holds(held), 10)
    assert submit(engine, "update", held).wait(20)
    assert counting.runs == ["h", "h"]
    local_kube.put({**held, "metadata": {**held["metadata"], "finalizers": []}})
    assert local_kube.get("v1", "Secret", "h-copy", NS) is None
    ticket, _ = engine.submit(Event.for_object("delete", squatter))
    assert ticket.wait(20)
    assert {key for _name, key in ticket.results} == {Key(NS, "h")}
    assert (local_kube.get("v1", "Secret", "h-copy", NS) or {}).get(
        "metadata", {}).get("ownerReferences")


def test_an_object_in_the_way_of_two_parents_runs_both_when_it_goes(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """A user's handler may give two parents' children one name: the object in the way of
    both was remembered for the last one only, the other left to its backoff."""
    plain = counting.reconcile

    def one_name(parent: Obj, reads: Any) -> Desired:
        desired = plain(parent, reads)
        for child in desired.children:
            child["metadata"]["name"] = "shared-copy"  # type: ignore[index]
        return desired

    counting.ctl.reconcile_fn = one_name
    squatter = local_kube.put({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "shared-copy", "namespace": NS},
                               "stringData": {"v": "x"}})
    for name in ("p1", "p2"):
        assert submit(engine, "add", local_kube.put(cm(name, {"v": "1"}))).wait(20)
    local_kube.remove("v1", "Secret", "shared-copy", NS)
    ticket, _ = engine.submit(Event.for_object("delete", squatter))
    assert ticket.wait(20)
    assert {key for _name, key in ticket.results} == {Key(NS, "p1"), Key(NS, "p2")}


def test_a_child_taken_over_by_removing_its_owner_reference_is_its_former_parents_business(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """The change removes what mapped the child to its parent: the parent is mapped from
    the child's previous owner (a RoleBinding taken over and given to someone else, unseen
    by its Tenant until the Tenant itself changed)."""
    parent = local_kube.put(cm("o", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    child = local_kube.get("v1", "Secret", "o-copy", NS)
    taken = local_kube.put({**child, "metadata": {
        k: v for k, v in child["metadata"].items() if k != "ownerReferences"}})
    informer = engine.cache.informer("v1", "Secret")
    assert informer is not None and wait_until(lambda: informer.holds(taken), 10)
    ticket, _ = engine.submit(Event.for_object("update", taken))
    assert ticket.wait(20) and ticket.results[("counting", Key(NS, "o"))].ok
    assert counting.runs == ["o", "o"]


def test_a_parent_update_that_changes_only_its_status_costs_no_run(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    parent = local_kube.put(cm("d", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    relabelled = local_kube.put({**parent, "metadata": {**parent["metadata"],
                                                        "annotations": {"x": "y"}}})
    assert submit(engine, "update", relabelled).wait(20)
    assert counting.runs == ["d", "d"]  # metadata changed: a run
    stored = local_kube.get("v1", "ConfigMap", "d", NS)
    ticket, notes = engine.submit(Event.for_object("update", stored))  # same object again
    assert ticket.wait(5)
    assert notes == {"counting": "only status or resourceVersion changed"}
    assert counting.runs == ["d", "d"]


def test_an_event_the_cache_does_not_reach_is_a_503_to_send_again(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """A version the API server has written but the cache of the kind has not seen (here
    a Secret's: no ConfigMap change will ever carry it, as a cache whose watch is stuck
    would not see a real one): 503, the sender tries again."""
    obj = local_kube.put(cm("e", {"v": "1"}))
    other = local_kube.put({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": "s", "namespace": NS}})
    unseen = {**obj, "metadata": {**obj["metadata"],
                                  "resourceVersion": other["metadata"]["resourceVersion"]}}
    engine.settings = EngineSettings(workers=1, cache_wait=0.5)
    with pytest.raises(CacheBehind, match="did not reach resourceVersion"):
        engine.submit(Event.for_object("update", unseen))
    assert submit(engine, "add", obj).wait(20)  # the cache has this one: runs
    assert counting.runs == ["e"]


def test_an_event_ahead_of_the_api_server_runs_on_the_object_as_it_is_now(
        engine: Engine, local_kube: Any, counting: Counting,
        caplog: pytest.LogCaptureFixture) -> None:
    """A version the API server has not even reached (forged, or another cluster's): no
    wait would ever end, and a 503 would be sent again forever; it is run on the current
    object instead, with a warning."""
    obj = local_kube.put(cm("f", {"v": "1"}))
    ahead = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(
        int(obj["metadata"]["resourceVersion"]) + 1000)}}
    gone = {**ahead, "metadata": {**ahead["metadata"], "name": "never-made"}}
    engine.settings = EngineSettings(workers=1, cache_wait=0.5)
    assert submit(engine, "update", ahead).wait(20)
    assert submit(engine, "add", gone).wait(20)
    assert counting.runs == ["f"]  # (and no run of an object that does not exist)
    assert "which the API server has not reached" in caplog.text


def test_an_event_with_a_resource_version_no_api_server_writes_waits_for_the_current_one(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    obj = local_kube.put(cm("g", {"v": "1"}))
    forged = {**obj, "metadata": {**obj["metadata"], "resourceVersion": ":"}}
    engine.settings = EngineSettings(workers=1, cache_wait=5.0)
    assert submit(engine, "add", forged).wait(20)  # no CacheBehind (a 503) after 5 s
    assert counting.runs == ["g"]


def service(name: str) -> Obj:
    """An object of a kind the engine does not cache (a Namespace would not do: the local
    API server, as the root-CA publisher, puts a ConfigMap into each)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"ports": [{"port": 80}]}}


def ref_event(change: str, obj: Obj) -> Event:
    """A Reference-mode event (Knative ApiServerSource ``mode: Reference``): no version."""
    meta = obj["metadata"]
    return Event(id=f"ref-{meta['name']}-{change}", type=f"dev.knative.apiserver.ref.{change}",
                 source="test", data={"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                      "name": meta["name"], "namespace": meta.get("namespace")})


def as_real_bookmarks(local_kube: Any) -> None:
    """Bookmarks as rare as a real v1.24 API server's (about one per watch, near its end):
    the local one's default of one a second would hide a wait for a version that only a
    bookmark brings. (The watches' bookmark already due comes first.)"""
    local_kube.bookmark_interval = 3600.0
    time.sleep(1.2)


def test_a_reference_mode_event_waits_for_its_objects_version_not_the_api_servers(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    as_real_bookmarks(local_kube)
    obj = local_kube.put(cm("r", {"v": "1"}))
    # Changes of a kind this engine does not cache: the API server's newest resourceVersion
    # moves on, which the ConfigMap watch never sees (no bookmark in between)
    for i in range(3):
        local_kube.put(service(f"x{i}"))
    engine.settings = EngineSettings(workers=1, cache_wait=2.0)
    ticket, _notes = engine.submit(ref_event("update", obj))  # no CacheBehind (a 503)
    assert ticket.wait(20) and ticket.results[("counting", Key(NS, "r"))].ok
    assert counting.runs == ["r"]


def test_a_reference_mode_event_of_an_object_that_is_gone_waits_only_for_the_cache_to_drop_it(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    obj = local_kube.put(cm("s", {"v": "1"}))
    assert wait_until(lambda: submit(engine, "add", obj).wait(20), 20)
    as_real_bookmarks(local_kube)
    local_kube.remove("v1", "ConfigMap", "s", NS)
    local_kube.put(service("y0"))
    engine.settings = EngineSettings(workers=1, cache_wait=2.0)
    ticket, _notes = engine.submit(ref_event("delete", obj))
    assert ticket.wait(20)
    assert engine.cache.informer("v1", "ConfigMap").store.get(NS, "s") is None


def test_a_delete_of_an_object_that_is_there_is_run_on_it_at_once_and_said(
        engine: Engine, local_kube: Any, counting: Counting,
        caplog: pytest.LogCaptureFixture) -> None:
    """No deletion carries the version the cache holds alive (a deletion is a newer one):
    such a delete is stale or forged. Asked of the API server once, it is run on the object
    as it is, instead of waiting for a deletion that never comes (a trial saw 10 s)."""
    obj = local_kube.put(cm("alive", {"v": "1"}))
    assert wait_until(lambda: submit(engine, "add", obj).wait(20), 20)
    engine.settings = EngineSettings(workers=1, cache_wait=600.0)  # a wait would outlast
    with caplog.at_level(logging.WARNING, logger="eventop.engine"):
        ticket, _notes = engine.submit(Event.for_object("delete", obj))
        assert ticket.wait(20) and ticket.results[("counting", Key(NS, "alive"))].ok
    assert engine.cache.informer("v1", "ConfigMap").store.get(NS, "alive") is not None
    [line] = [r.getMessage() for r in caplog.records if "stale or forged" in r.getMessage()]
    assert f"deletes ConfigMap {NS}/alive at resourceVersion " \
           f"{obj['metadata']['resourceVersion']}, but the API server has it" in line


def test_an_event_naming_a_namespaced_object_without_its_namespace_is_refused_not_taken_as_gone(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """Looked up as it is, the object would be "gone" (or found in another namespace): no
    API server sends such an event, so it is the sender's mistake (the router answers 400)."""
    obj = local_kube.put(cm("t", {"v": "1"}))
    nameless = {**obj, "metadata": {k: v for k, v in obj["metadata"].items()
                                    if k != "namespace"}}
    for event in (ref_event("add", nameless), Event.for_object("add", nameless)):
        with pytest.raises(InvalidEvent, match="without a namespace, but ConfigMap is "
                                               "namespaced"):
            engine.submit(event)
    assert counting.runs == []


def test_a_status_worked_out_before_the_runs_writes_is_brought_up_to_date_by_one_more_run(
        local_kube: Any, kube: Any) -> None:
    # The status says what the run saw before writing; the echo of its write costs no run,
    # so without one more run it would say "no child yet" until something else changed.
    ctl = Controller("follow", parent="eventop.dev/v1/CopyRule", owns=["v1/ConfigMap"],
                     registry=Registry(), module="tests.engine")
    runs: list[str] = []

    @ctl.reconcile
    def desired(rule: Obj, reads: Any) -> Desired:
        seen = reads.get("v1/ConfigMap", "follow-child", NS) is not None
        runs.append("saw the child" if seen else "no child yet")
        return Desired([{"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "follow-child", "namespace": NS}}],
                       status={"lastError": "saw the child" if seen else "no child yet"})

    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    eng = Engine([ctl], kube, settings=EngineSettings(workers=1, cache_wait=5.0,
                                                       run_on_watch=False))
    eng.start()
    try:
        assert wait_until(lambda: eng.readiness()[0], 20), eng.readiness()
        assert eng.started.wait(20) and wait_until(eng.queue.idle, 20)  # first runs done
        rule = local_kube.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                               "metadata": {"name": "follow"},
                               "spec": {"ruleType": "configmap", "namespaces": [NS],
                                        "selector": {"matchLabels": {"a": "b"}}}})
        ticket, _notes = eng.submit(Event.for_object("add", rule))
        assert ticket.wait(20)
        assert wait_until(lambda: (local_kube.get("eventop.dev/v1", "CopyRule", "follow")
                                   .get("status") or {}).get("lastError") == "saw the child",
                          10), runs
        assert wait_until(eng.queue.idle, 10)
        assert runs == ["no child yet", "saw the child"]  # one more run, not a loop
        # A function that writes on every run (here: a counter) gets a bounded number of
        # runs after its writes, then waits for the next change: not a loop.
        ctl.reconcile_fn = lambda rule, reads: (runs.append("writes again") or Desired(
            [{"apiVersion": "v1", "kind": "ConfigMap", "data": {"n": str(len(runs))},
              "metadata": {"name": "follow-child", "namespace": NS}}],
            status={"lastError": f"run {len(runs)}"}))
        changed = local_kube.put({**rule, "spec": {**rule["spec"], "namespaces": ["other"]}})
        ticket, _notes = eng.submit(Event.for_object("update", changed))
        assert ticket.wait(20) and wait_until(eng.queue.idle, 10)
        time.sleep(0.5)
        assert runs[2:] == ["writes again"] * (1 + MAX_FOLLOWUPS)
    finally:
        eng.stop()


def test_the_cache_relists_after_the_watch_history_expired(
        engine: Engine, local_kube: Any) -> None:
    kept = local_kube.put(cm("kept"))
    gone = local_kube.put(cm("gone"))
    informer = engine.cache.informer("v1", "ConfigMap")
    assert informer is not None and wait_until(lambda: informer.holds(gone), 10)
    local_kube.set_unavailable(True)  # the cache loses its watch and cannot come back yet
    local_kube.remove("v1", "ConfigMap", "gone", NS)
    changed = local_kube.put(cm("kept", {"v": "2"}))
    added = local_kube.put(cm("added"))
    local_kube.compact()  # the history it would resume from is gone: 410 Expired
    local_kube.set_unavailable(False)
    store = informer.store
    assert store is not None
    assert wait_until(lambda: store.get(NS, "added") is not None, 30)
    assert store.get(NS, "gone") is None
    assert store.get(NS, "kept")["metadata"]["resourceVersion"] == \
        changed["metadata"]["resourceVersion"] != kept["metadata"]["resourceVersion"]
    assert store.get(NS, "added")["metadata"]["uid"] == added["metadata"]["uid"]
    lists = [r for r in local_kube.requests if r[0] == "GET"
             and r[1] == "/api/v1/configmaps" and "watch=true" not in r[2]]
    assert len(lists) == 2  # the first list and the one after 410


def test_a_handler_reading_a_kind_it_did_not_declare_fails_naming_it(
        local_kube: Any, kube: Any) -> None:
    ctl = Controller("nosy", parent="v1/ConfigMap", registry=Registry(), module="tests.engine")
    ctl.reconcile(lambda parent, reads: reads.list("v1/Pod") and Desired())
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    eng = Engine([ctl], kube, settings=EngineSettings(workers=1)).start()
    try:
        assert wait_until(lambda: eng.readiness()[0], 20)
        ticket, _ = eng.submit(Event.for_object("add", local_kube.put(cm("g"))))
        assert ticket.wait(20)
        (result,) = ticket.results.values()
        assert not result.ok
        assert result.detail == (
            "UndeclaredKind: handler 'nosy' read v1/Pod, which it did not declare: add "
            "'v1/Pod' to its reads=[...] (or owns=[...]) so that the router caches and "
            "watches it and RBAC grants it")
    finally:
        eng.stop()


# -- the queue alone -----------------------------------------------------------------------


def test_queue_merges_requests_for_a_queued_key_and_runs_a_dirty_key_once_more() -> None:
    queue = WorkQueue()
    tickets = [Ticket() for _ in range(5)]
    for t in tickets[:3]:
        queue.add("k", t)
    assert len(queue) == 1
    assert queue.get(0) == "k"
    for t in tickets[3:]:
        queue.add("k", t)  # while running: dirty
    assert len(queue) == 0
    queue.done(Result("k", True, "first"))
    assert [t.seal().wait(0) for t in tickets] == [True, True, True, False, False]
    assert queue.get(0) == "k"
    queue.done(Result("k", True, "second"))
    assert all(t.wait(0) for t in tickets)
    assert tickets[4].results["k"].detail == "second"
    assert queue.get(0) is None


def test_queue_starts_the_next_run_of_a_key_once_the_running_one_has_sent_its_writes() -> None:
    queue = WorkQueue(depth=2)
    first, second, third = Ticket(), Ticket(), Ticket()
    queue.add("k", first)
    assert queue.get(0) == "k"
    queue.add("k", second)  # while computing: dirty, not handed out
    assert queue.get(0) is None
    queue.release("k")  # its writes are sent: the next run may start
    assert queue.get(0) == "k"
    queue.release("k")
    queue.add("k", third)  # two runs under way, the depth: waits for one to end
    assert queue.get(0) is None
    queue.done(Result("k", True, "first"), released=True)
    assert first.seal().wait(0) and not second.seal().wait(0)
    assert first.results["k"].detail == "first"
    assert queue.get(0) == "k"  # the third run, now that one ended
    queue.done(Result("k", True, "second"), released=True)
    queue.done(Result("k", True, "third"))
    assert second.results["k"].detail == "second" and third.seal().wait(0)


def test_queue_gives_an_event_a_run_under_way_that_started_after_its_change_was_cached(
) -> None:
    queue = WorkQueue()
    cached = time.monotonic()
    queue.add("k")  # the router's own watch saw the change at t=cached
    assert queue.get(0) == "k"
    late = Ticket()
    queue.add("k", late, since=cached)  # the watcher's event about it, arriving now
    queue.done(Result("k", True, "watch-started"))
    assert late.seal().wait(0) and late.results["k"].detail == "watch-started"
    assert queue.get(0) is None  # no second run
    again = Ticket()
    queue.add("k", again, since=cached)  # redelivered (a resync) after that run ended
    assert queue.get(0) == "k"  # a run of its own: the world outside the cache may differ
    queue.done(Result("k", True, "again"))
    assert again.seal().wait(0) and again.results["k"].detail == "again"
    newer = Ticket()
    queue.add("k", newer, since=time.monotonic())
    assert queue.get(0) == "k"


def test_queue_backs_off_a_failing_key_alone() -> None:
    from eventop.kube.backoff import Backoff

    queue = WorkQueue(Backoff(10.0, 60.0))
    queue.add("bad")
    queue.add("good")
    assert queue.get(0) == "bad"
    delay = queue.retry("bad")
    queue.done(Result("bad", False, "failed"))
    assert delay >= 5.0
    assert queue.get(0) == "good"  # the other key flows
    queue.done(Result("good", True))
    assert queue.get(0.1) is None  # the failing one waits for its backoff
    queue.add_after("soon", 0.05)
    assert queue.get(2) == "soon"


def test_a_key_asked_for_again_and_again_later_keeps_one_due_time_the_earliest() -> None:
    """Every run of a Database asks for a run at its next backup tick; kept apart, the
    requests piled up (thousands a day) and every done() scanned them all."""
    queue = WorkQueue()
    for _ in range(1000):
        queue.add_after("db", 3600)
    queue.add_after("db", 0.05)  # sooner: replaces the later one
    queue.add_after("db", 60)
    assert len(queue._delayed) == 1
    assert queue.get(2) == "db"
    queue.done(Result("db", True))
    assert queue._delayed == [] and queue.idle()


def test_a_handler_holds_at_most_its_share_of_the_workers_while_others_wait() -> None:
    """With the rates provider down, each ExchangeRate run spent its retries on a worker;
    sixteen of them held all eight, and the copies of new namespaces waited 4-5 s."""
    queue = WorkQueue(share=(lambda item: item[0], 1))
    for item in (("rates", "a"), ("rates", "b"), ("copies", "x")):
        queue.add(item)
    assert queue.get(0) == ("rates", "a")
    assert queue.get(0) == ("copies", "x")  # past the rates key waiting for its share
    assert queue.get(0.1) is None  # "rates" holds its one worker
    queue.done(Result(("rates", "a"), True))
    assert queue.get(1) == ("rates", "b")


def test_the_engine_gives_each_of_several_handlers_half_of_its_workers(
        kube: Any) -> None:
    one = Controller("one", parent="v1/ConfigMap", registry=Registry(), module="tests.engine")
    two = Controller("two", parent="v1/Secret", registry=Registry(), module="tests.engine")
    for ctl in (one, two):
        ctl.reconcile(lambda parent, reads: Desired())
    assert Engine([one, two], kube, settings=EngineSettings(workers=8)).queue._share == 4
    assert Engine([one], kube, settings=EngineSettings(workers=8)).queue._share == 8


def test_key_of_an_owned_child_is_its_controllers() -> None:
    counting = Counting()
    child = {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": "x-copy", "namespace": NS, "ownerReferences": [
                 {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u",
                  "controller": True}]}}
    reads: Any = None  # owner mapping reads nothing
    assert counting.ctl.keys_for(child, reads, parent_namespaced=True) == {Key(NS, "x")}


def test_runs_of_a_parent_that_may_overlap_do_not_wait_for_a_slow_write_nor_repeat_it(
        local_kube: Any, kube: Any) -> None:
    ctl = Controller("fanout", parent="v1/ConfigMap", owns=["v1/Secret"], overlap=True,
                     registry=Registry(), module="tests.engine")

    @ctl.reconcile
    def secrets(parent: Obj, reads: Any) -> Desired:
        name = parent["metadata"]["name"]
        return Desired([{"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": f"{name}-{k}", "namespace": NS},
                         "stringData": {"v": v}}
                        for k, v in (parent.get("data") or {}).items()], status=None)

    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    eng = Engine([ctl], kube, settings=EngineSettings(workers=2, run_on_watch=False)).start()
    writer = eng.writers["fanout"]
    slow, sent = threading.Event(), threading.Event()
    creates: list[str] = []
    create = writer.create

    def slow_create(obj: Obj, **kwargs: Any) -> Obj:
        creates.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "src-a":
            sent.set()
            assert slow.wait(20)
        return create(obj, **kwargs)

    writer.create = slow_create  # type: ignore[method-assign]
    try:
        assert wait_until(lambda: eng.readiness()[0], 20) and eng.started.wait(20)
        first = submit(eng, "add", local_kube.put(cm("src", {"a": "1"})))
        assert sent.wait(10)  # the first run's write of src-a hangs
        second = submit(eng, "update", local_kube.put(cm("src", {"a": "1", "b": "2"})))
        assert wait_until(lambda: local_kube.get("v1", "Secret", "src-b", NS) is not None, 10)
        assert not first.wait(0) and not second.wait(0)  # both wait for src-a
        slow.set()
        assert first.wait(20) and second.wait(20)
        # src-a sent once, by the first run (kube-root-ca.crt is a parent here too)
        assert sorted(c for c in creates if c.startswith("src-")) == ["src-a", "src-b"]
        assert local_kube.get("v1", "Secret", "src-a", NS) is not None
    finally:
        slow.set()
        eng.stop()


def test_what_was_reported_about_a_parent_is_forgotten_once_it_is_gone(
        engine: Engine, local_kube: Any, counting: Counting) -> None:
    """The conflicts and refusals already reported per parent (so that each is an Event
    once) are kept while it lives, not for every parent the process ever saw."""
    parent = local_kube.put(cm("brief", {"v": "1"}))
    assert submit(engine, "add", parent).wait(20)
    uid = parent["metadata"]["uid"]
    assert uid in engine._conflicts
    local_kube.remove("v1", "ConfigMap", "brief", NS)
    assert submit(engine, "delete", parent).wait(20)
    assert uid not in engine._conflicts


def test_a_run_refused_by_authorization_is_tried_again_within_the_short_cap(
        local_kube: Any, kube: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 (a grant removed, or not applied yet) is mended by nothing this handler sees
    an event of: its next try, at most REFUSED_RETRY_CAP later rather than minutes, is what
    takes the grant up. Any other failure keeps the full backoff."""
    from eventop.engine import run
    from eventop.kube.backoff import Backoff
    from eventop.kube.errors import Forbidden

    monkeypatch.setattr(run, "REFUSED_RETRY_CAP", 0.1)
    calls: dict[str, int] = {"forbidden": 0, "broken": 0}

    def failing(parent: Obj, reads: Any) -> Desired:
        name = parent["metadata"]["name"]
        if name in calls:
            calls[name] += 1
            if name == "forbidden":
                raise Forbidden('configmaps "x" is forbidden: User "system:serviceaccount:'
                                'eventop-system:eventop-router" cannot patch resource')
            raise ValueError("a bug")
        return Desired()

    ctl = Controller("refused", parent="v1/ConfigMap", registry=Registry(), module="tests.engine")
    ctl.reconcile(failing)
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    local_kube.put(cm("forbidden"))
    local_kube.put(cm("broken"))
    eng = Engine([ctl], kube, settings=EngineSettings(workers=2, cache_wait=5.0))
    eng.queue.backoff = Backoff(60.0, 300.0)  # uncapped, a retry would wait 30 s or more
    eng.start()
    try:
        assert wait_until(lambda: calls["forbidden"] >= 4, 10), calls
        assert calls["broken"] == 1
    finally:
        eng.stop()


def test_a_child_write_refused_by_authorization_is_tried_again_within_the_short_cap(
        local_kube: Any, kube: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.engine import run
    from eventop.kube.backoff import Backoff
    from eventop.kube.errors import Forbidden

    monkeypatch.setattr(run, "REFUSED_RETRY_CAP", 0.1)
    runs: list[str] = []

    def wants_a_secret(parent: Obj, reads: Any) -> Desired:
        if parent["metadata"]["name"] != "guarded":
            return Desired()
        runs.append("guarded")
        return Desired([{"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "guarded-copy", "namespace": NS}}], status=None)

    ctl = Controller("guarded", parent="v1/ConfigMap", owns=["v1/Secret"], registry=Registry(),
                     module="tests.engine")
    ctl.reconcile(wants_a_secret)
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    local_kube.put(cm("guarded"))
    eng = Engine([ctl], kube, settings=EngineSettings(workers=2, cache_wait=5.0))
    eng.queue.backoff = Backoff(60.0, 300.0)

    def refused(obj: Obj) -> Obj:
        raise Forbidden('secrets is forbidden: User "system:serviceaccount:eventop-system:'
                        'eventop-router" cannot create resource "secrets"')

    monkeypatch.setattr(eng.writers["guarded"].kube, "create", refused)
    eng.start()
    try:
        assert wait_until(lambda: len(runs) >= 4, 10), runs
    finally:
        eng.stop()


def noting_snapshots() -> tuple[Controller, list[str]]:
    """A controller of VolumeSnapshots (an add-on's CRD the tests install and delete) that
    notes the name of every parent it runs for."""
    seen: list[str] = []

    def noting(parent: Obj, reads: Any) -> Desired:
        seen.append(parent["metadata"]["name"])
        return Desired(status=None)

    ctl = Controller("snapshots", parent="snapshot.storage.k8s.io/v1/VolumeSnapshot",
                     registry=Registry(), module="tests.engine")
    ctl.reconcile(noting)
    return ctl, seen


def volume_snapshot(name: str) -> Obj:
    return {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"source": {"persistentVolumeClaimName": "data"}}}


def test_the_first_event_of_a_parent_kind_installed_late_makes_the_cache_serve_it_at_once(
        local_kube: Any, kube: Any) -> None:
    """CRDs applied after the router started: the cache looks for the kind every 10 s, and
    the first event of it is answered 503 (CacheBehind). That event is the news that the
    kind is served: its redelivery (0.2 s to a few seconds later) is run, not answered 503
    again until the next poll."""
    import yaml

    from tests.kube.test_informer import SNAPSHOTS

    ctl, seen = noting_snapshots()
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    eng = Engine([ctl], kube, settings=EngineSettings(workers=2, cache_wait=5.0)).start()
    try:
        informer = eng.cache.informer("snapshot.storage.k8s.io/v1", "VolumeSnapshot")
        assert informer is not None and informer.missing_retry >= 10
        assert wait_until(lambda: informer.missing, 10)
        local_kube.put(yaml.safe_load(SNAPSHOTS.read_text()))
        snapshot = local_kube.put(volume_snapshot("nightly"))
        with pytest.raises(CacheBehind, match="not served yet"):
            submit(eng, "add", snapshot)
        assert wait_until(lambda: informer.synced, 5)  # not the 10 s of the next poll
        assert submit(eng, "add", snapshot).wait(10)
        assert "nightly" in seen
    finally:
        eng.stop()


def test_a_run_of_a_parent_whose_crd_was_deleted_ends_quietly_and_its_return_runs_all(
        local_kube: Any, kube: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Its CRD deleted, every parent goes with it: a run still queued logged an ERROR and
    was retried for good (0.3 s ... 108 s, a user's trial), until the CRD came back."""
    import logging

    import yaml

    from tests.kube.test_informer import SNAPSHOTS

    ctl, seen = noting_snapshots()
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    crd = local_kube.put(yaml.safe_load(SNAPSHOTS.read_text()))
    eng = Engine([ctl], kube, settings=EngineSettings(workers=2, cache_wait=1.0)).start()
    try:
        informer = eng.cache.informer("snapshot.storage.k8s.io/v1", "VolumeSnapshot")
        assert informer is not None and wait_until(lambda: informer.synced, 10)
        local_kube.remove(crd["apiVersion"], crd["kind"], crd["metadata"]["name"])
        assert wait_until(lambda: informer.missing, 15)
        ticket = Ticket()
        with caplog.at_level(logging.WARNING, logger="eventop.engine"):
            eng._add(ctl, Key(NS, "nightly"), ticket)
            ticket.seal()
            assert ticket.wait(10)
        [result] = ticket.results.values()
        assert result.ok and "is not served" in result.detail
        assert [r for r in caplog.records if "failed, retried" in r.getMessage()] == []
        # served again (here: installed again; after a 404 in passing its objects are
        # there all along): what is listed is run, though no watch announced it
        local_kube.put(crd)
        local_kube.put(volume_snapshot("weekly"))
        informer.look_again()
        assert wait_until(lambda: "weekly" in seen, 10)
    finally:
        eng.stop()
