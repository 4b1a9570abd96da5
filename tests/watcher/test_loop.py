"""The list/watch loop fed with scripted (and recorded) API server answers.

A scripted API server makes the rare cases exact and instant: the recorded 410 ERROR event of
``watch-expired``, a line cut in half, a non-410 ERROR, a 410 on the watch request itself.
The same behaviours are exercised through real HTTP in ``test_localkube.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop.kube import Kube, Unavailable
from eventop.kube.errors import Conflict
from eventop.kube.reflector import Reflector, Sink, Watched, WatchSettings
from eventop.kube.resources import Resource, ResourceTable
from eventop.watcher.delivery import Backoff, Deliverer, RetryPolicy
from eventop.watcher.specs import ResourceSpec
from eventop.watcher.watch import DELETED_UNWATCHED, ResourceWatcher

REC = Path(__file__).resolve().parents[1] / "recordings"
EXPIRED_LINE = (REC / "watch-expired" / "api_v1_configmaps.watch-from-rv1.jsonl").read_bytes()


def cm(name: str, rv: int, uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "demo", "uid": uid or f"uid-{name}",
                         "resourceVersion": str(rv), "labels": {"copy": "yes"},
                         "annotations": {"big": "x" * 100}},
            "data": {"v": str(rv)}}


def line(wtype: str, obj: dict[str, Any]) -> bytes:
    if wtype != "BOOKMARK":
        obj = {"kind": "ConfigMap", "apiVersion": "v1", **obj}
    return json.dumps({"type": wtype, "object": obj}).encode()


def bookmark(rv: int) -> bytes:
    return line("BOOKMARK", {"kind": "ConfigMap", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(rv)}})


class ScriptedKube(Kube):
    """Answers LISTs and watches from a script; records what was asked. Pagination, kind
    filling and resource lookup are the real client's, over the scripted ``request``."""

    host = "https://scripted:6443"  # type: ignore[assignment]

    def __init__(self, lists: list[list[dict[str, Any]] | Exception],
                 watches: list[list[bytes] | Exception]) -> None:
        self.resources = ResourceTable()
        self.lists = lists
        self.watches = watches
        self.list_queries: list[dict[str, Any]] = []
        self.watch_queries: list[dict[str, Any]] = []
        self.done = threading.Event()

    def request(self, method: str, path: str, *, verb: str, query: Any = None,
                timeout: Any = None, **_: Any) -> Any:
        assert verb == "list", verb
        q = dict(query or [])
        self.list_queries.append(q)
        item = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]  # last repeats
        if isinstance(item, Exception):
            raise item
        rv = str(max([int(o["metadata"]["resourceVersion"]) for o in item] + [100]))
        return {"kind": "ConfigMapList", "apiVersion": "v1",
                "metadata": {"resourceVersion": rv}, "items": [dict(o) for o in item]}

    def iter_watch(self, res: Resource, namespace: str | None, query: Any,
                   timeout: Any) -> Iterator[bytes]:
        """Lazy like :meth:`eventop.kube.Kube.iter_watch`: errors come with the first line."""
        self.watch_queries.append(dict(query))
        if not self.watches:
            self.done.set()
            item: list[bytes] | Exception = []
        else:
            item = self.watches.pop(0)

        def lines() -> Iterator[bytes]:
            if isinstance(item, Exception):
                raise item
            yield from item

        return lines()


@pytest.fixture
def run_loop(sink):
    started: list[tuple[ResourceWatcher, threading.Event, Deliverer]] = []

    def run(kube: ScriptedKube, *, resync: float = 0.0, expect: int = 0) -> ResourceWatcher:
        stop = threading.Event()
        deliverer = Deliverer(sink.url, lanes=2, queue_size=10,
                              policy=RetryPolicy(Backoff(0.01, 0.05), (1.0, 5.0))).start()
        settings = WatchSettings(watch_timeout=5, read_timeout=1.0, connect_timeout=1.0,
                                 resync_seconds=resync, backoff=Backoff(0.01, 0.05))
        loop = ResourceWatcher(kube, ResourceSpec.parse("v1/configmaps@demo"),  # type: ignore[arg-type]
                               deliverer, "test", settings, stop)
        started.append((loop, stop, deliverer))
        loop.start()
        assert kube.done.wait(10), "the loop did not consume its script"
        assert sink.wait_for(expect, 10)
        assert deliverer.join(10)
        return loop

    yield run
    for loop, stop, deliverer in started:
        stop.set()
        deliverer.stop()
        loop.join(5)


def changes(sink) -> list[str]:
    return [f"{r.type.rsplit('.', 1)[1]} {r.id.split('/')[0]} {r.id.split('/')[1]}"
            for r in sink.accepted]


def of(sink, uid: str) -> list[str]:
    """The changes of one object, in delivery order (guaranteed per object only)."""
    return [c for c in changes(sink) if c.split()[1] == uid]


def test_list_then_watch_from_the_list_version_with_bookmarks(sink, run_loop) -> None:
    kube = ScriptedKube([[cm("a", 10), cm("b", 11)]],
                        [[line("MODIFIED", cm("a", 12)), bookmark(15)]])
    loop = run_loop(kube, expect=3)
    assert sorted(changes(sink)) == ["add uid-a 10", "add uid-b 11", "update uid-a 12"]
    assert of(sink, "uid-a") == ["add uid-a 10", "update uid-a 12"]
    first, second = kube.watch_queries[:2]
    assert first["resourceVersion"] == "100" and first["allowWatchBookmarks"] == "true"
    assert second["resourceVersion"] == "15"  # resumed from the bookmark
    assert {u: k[:3] for u, k in loop.known.items()} == {"uid-a": ("12", "demo", "a"),
                                                        "uid-b": ("11", "demo", "b")}


def test_recorded_410_error_event_relists_and_emits_exactly_the_difference(
        sink, run_loop, caplog: pytest.LogCaptureFixture) -> None:
    kube = ScriptedKube(
        [[cm("a", 10), cm("b", 11), cm("c", 12)],
         [cm("a", 20), cm("c", 12), cm("d", 21)]],  # a changed, b gone, c same, d new
        [[EXPIRED_LINE]])
    with caplog.at_level(logging.WARNING, "eventop.watcher"):
        run_loop(kube, expect=6)
    assert len(kube.list_queries) == 2
    assert sorted(changes(sink)) == ["add uid-a 10", "add uid-b 11", "add uid-c 12",
                                     "add uid-d 21", "delete uid-b 11", "update uid-a 20"]
    deleted = next(r for r in sink.accepted if r.type.endswith(".delete"))
    data = json.loads(deleted.body)
    assert data["kind"] == "ConfigMap" and data["metadata"]["name"] == "b"
    assert data["metadata"]["annotations"] == {DELETED_UNWATCHED: "true"}
    assert data["metadata"]["labels"] == {"copy": "yes"}  # what handlers match deletes by
    assert "data" not in data
    assert deleted.subject == "/apis/v1/namespaces/demo/configmaps/b"
    assert "too old resource version" in caplog.text


def test_a_relist_sends_the_delete_of_a_name_made_again_while_unwatched_before_its_add(
        sink, run_loop) -> None:
    """Deleted and created again under its name during the gap a 410 left: the re-list sees
    a new uid. The old one's delete goes first, in the name's lane, as the watch would have
    said it: a delete function that cleans up by name must not run after the new object's
    add."""
    kube = ScriptedKube([[cm("a", 10, uid="old")], [cm("a", 20, uid="new")]],
                        [[EXPIRED_LINE]])
    loop = run_loop(kube, expect=3)
    assert changes(sink) == ["add old 10", "delete old 10", "add new 20"]
    assert set(loop.known) == {"new"}


def test_http_410_on_the_watch_request_relists_too(sink, run_loop) -> None:
    kube = ScriptedKube([[cm("a", 10)], [cm("a", 10)]],
                        [Conflict("too old", status=410, reason="Expired")])
    run_loop(kube, expect=1)
    assert len(kube.list_queries) == 2
    assert changes(sink) == ["add uid-a 10"]  # nothing changed: nothing more to say


def test_truncated_line_resumes_from_the_last_change_without_loss(
        sink, run_loop, caplog: pytest.LogCaptureFixture) -> None:
    good = line("ADDED", cm("x", 31))
    cut = line("MODIFIED", cm("x", 32))[:40]
    kube = ScriptedKube([[]], [[good, cut], [line("MODIFIED", cm("x", 32))]])
    with caplog.at_level(logging.WARNING, "eventop.watcher"):
        run_loop(kube, expect=2)
    assert kube.watch_queries[1]["resourceVersion"] == "31"
    assert changes(sink) == ["add uid-x 31", "update uid-x 32"]
    assert "undecodable watch line" in caplog.text


def test_other_error_events_and_api_failures_are_retried_forever(
        sink, run_loop, caplog: pytest.LogCaptureFixture) -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
              "reason": "InternalError", "message": "etcd leader changed"}
    kube = ScriptedKube(
        [Unavailable("list: Kubernetes API unreachable at x: refused"), [cm("a", 10)]],
        [json.dumps({"type": "ERROR", "object": status}).encode().splitlines(),
         Unavailable("watch: Kubernetes API unreachable at x: refused"),
         [line("DELETED", cm("a", 40))]])
    with caplog.at_level(logging.INFO, "eventop.watcher"):
        run_loop(kube, expect=2)
    assert changes(sink) == ["add uid-a 10", "delete uid-a 40"]
    assert [q["resourceVersion"] for q in kube.watch_queries[:3]] == ["100", "100", "100"]
    assert "etcd leader changed" in caplog.text and "is the API server up" in caplog.text
    # each run of failures ends with a line saying so (else the log ends on an error)
    recovered = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert recovered[:1] == ["v1/configmaps@demo: the API server answers again after 1 "
                             "failed attempt; watching from resourceVersion 100"], recovered
    assert len(recovered) == 2


def test_periodic_resync_sends_every_object_again_as_update(sink, run_loop) -> None:
    kube = ScriptedKube([[cm("a", 10)], [cm("a", 10), cm("b", 11)]], [])
    kube.watches = [[]]  # one quiet watch, then the resync is due

    def quiet(*args: Any, **kw: Any) -> Iterator[bytes]:
        kube.watch_queries.append(dict(args[2]))
        if len(kube.watch_queries) > 2:
            kube.done.set()
        time.sleep(0.3)
        return (b for b in ())

    kube.iter_watch = quiet  # type: ignore[method-assign]
    run_loop(kube, resync=0.2, expect=3)
    assert of(sink, "uid-a")[:2] == ["add uid-a 10", "update uid-a 10"]
    assert of(sink, "uid-b")[:1] == ["add uid-b 11"]
    assert set(of(sink, "uid-b")[1:]) <= {"update uid-b 11"}  # later resyncs, same ids


class CountingBackoff(Backoff):
    """A backoff that waits nothing and records which attempts asked it for a delay."""

    def __init__(self) -> None:
        super().__init__(0.0, 0.0)
        object.__setattr__(self, "attempts", [])

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)  # type: ignore[attr-defined]
        return 0.0


def empty_watches(kube: ScriptedKube, count: int, lasting: float) -> None:
    """Every watch ends with nothing in it after ``lasting`` seconds, as an idle kind's does
    at its timeoutSeconds; the script is done after ``count`` of them."""

    def empty(*args: Any, **kw: Any) -> Iterator[bytes]:
        kube.watch_queries.append(dict(args[2]))
        if len(kube.watch_queries) >= count:
            kube.done.set()

        def stream() -> Iterator[bytes]:  # lazy, as the real one: the request comes first
            time.sleep(lasting)
            yield from ()

        return stream()

    kube.iter_watch = empty  # type: ignore[method-assign]


@pytest.mark.parametrize(("lasting", "backed_off"), [(0.15, False), (0.0, True)])
def test_an_idle_kinds_watch_ending_at_its_timeout_resumes_at_once_only_instant_ends_back_off(
        lasting: float, backed_off: bool) -> None:
    # An idle kind's every watch ends empty at its timeout; counting those as failures grew the
    # wait before the next watch to 15-30 s after a few minutes, a gap in which the router's
    # cache and the watcher were blind (seen as the router's 503 "cache did not reach ..." on
    # a real API server after ten idle minutes). An empty stream that ends at once still backs off.
    kube = ScriptedKube([[cm("a", 10)]], [])
    empty_watches(kube, 6, lasting)
    backoff = CountingBackoff()
    stop = threading.Event()
    reflector = Reflector(kube, Watched(kube.resources.by_kind("v1", "ConfigMap")),
                          Sink(), WatchSettings(backoff=backoff, short_watch=0.1), stop).start()
    try:
        assert kube.done.wait(10), "the reflector did not watch again"
    finally:
        stop.set()
        reflector.join(5)
    assert len(kube.watch_queries) >= 6
    assert {q["resourceVersion"] for q in kube.watch_queries} == {"100"}
    if backed_off:
        assert backoff.attempts[:5] == [0, 1, 2, 3, 4]  # growing, as before
    else:
        assert backoff.attempts == []
