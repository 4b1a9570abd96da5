"""The engine at work in the router: events in, keyed runs out, answers when they are done.

:meth:`Engine.submit` turns an event into keys (after waiting, bounded, for the cache to have
seen the event's change), queues them on the :class:`~eventop.engine.queue.WorkQueue` and
returns a :class:`~eventop.engine.queue.Ticket` the router waits on. Worker threads run the
keys (:func:`eventop.engine.run.run`) with cached reads and a :class:`KubeWriter` per handler.
See ``docs/ENGINE.md`` sections 5 to 7 for the rules.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client import Counter

from eventop.engine.apiserver import MAX_REMEMBERED, Echoes, KubeWriter
from eventop.engine.catchup import CacheBehind, CatchUp
from eventop.engine.controller import Controller
from eventop.engine.desired import Conflict
from eventop.engine.kinds import Key, merge_kinds
from eventop.engine.queue import Result, Ticket, WorkQueue
from eventop.engine.reads import Reads
from eventop.engine.run import Pipeline, retry_cap, run
from eventop.engine.settings import EngineSettings
from eventop.engine.write import InFlight
from eventop.handlers.events import Event, InvalidEvent
from eventop.kube import errors
from eventop.kube.client import Kube
from eventop.kube.informer import SERVED_AGAIN, Cache, InformerSpec
from eventop.kube.leader import LeaderElector, default_identity, default_namespace
from eventop.kube.objects import is_terminating
from eventop.kube.recent import Recent
from eventop.kube.resources import is_builtin_group, is_custom
from eventop.kube.store import Store

log = logging.getLogger("eventop.engine")

Obj = dict[str, Any]
Item = tuple[str, Key]  # (controller name, parent key)

RUNS = Counter("eventop_engine_runs_total", "Reconcile runs, by handler and outcome",
               ["handler", "outcome"])
REQUESTS = Counter("eventop_engine_requests_total",
                   "Reconcile requests: queued, merged into a queued or running run, or "
                   "skipped (echo of an own write, parent unchanged)", ["handler", "result"])


#: The Lease whose holder, of several router replicas, starts runs from its own watch.
ROUTER_LEASE = "eventop-router"


#: Why an event asked nothing of a handler (``Engine.submit``'s notes): answered without a
#: run, and logged at debug, as a run that wrote nothing is (QUIET_NOTES).
ECHO = "echo of its own write"
STATUS_ONLY = "only status or resourceVersion changed"
QUIET_NOTES = frozenset({ECHO, STATUS_ONLY})


#: Runs in a row that one run's writes may start for its status (see ``Engine._work``).
MAX_FOLLOWUPS = 3


class _Ran(NamedTuple):
    """How a run ended, for the queue (``Engine._work``)."""

    detail: str
    #: Try again with backoff (a lost race, a child not as desired: see RunResult), waiting
    #: at most ``cap`` seconds if given (a refusal by authorization: see retry_cap).
    retry: bool = False
    cap: float | None = None
    #: Run again after this many seconds, whatever happens meanwhile (the handler asked).
    requeue: float | None = None
    #: The status was worked out before the writes: one more run may find another.
    again: bool = False
    #: It wrote nothing and left nothing to do (RunResult.quiet).
    quiet: bool = False


@dataclass
class _Seen:
    """What a parent looked like at its last successful run: to skip updates that change
    nothing the function could react to."""

    fingerprint: str
    status: Any
    uid: str = ""


def fingerprint(obj: Obj) -> str:
    """The parent without status, resourceVersion and managedFields."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items()
            if k not in ("resourceVersion", "managedFields")}
    rest = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
    return json.dumps([meta, rest], sort_keys=True, default=str)


class Engine:
    """Controllers, their cache, their queue and the workers that run them."""

    def __init__(self, controllers: Iterable[Controller], kube: Kube, *,
                 settings: EngineSettings | None = None, cache: Cache | None = None) -> None:
        self.controllers = {c.name: c for c in controllers}
        for ctl in self.controllers.values():
            ctl.check()
        self.settings = settings or EngineSettings()
        kinds = merge_kinds([k for c in self.controllers.values() for k in c.kinds()])
        self.cache = cache or Cache(kube, [InformerSpec(k.api_version, k.kind, k.metadata_only,
                                                        k.selector, k.optional)
                                           for k in kinds.values()])
        # With several handlers, none holds more than half of the workers (as the watcher's
        # delivery gives a kind at most half of its lanes): a slow one never stalls the rest.
        share = max(1, self.settings.workers // 2) if len(self.controllers) > 1 \
            else self.settings.workers
        self.queue = WorkQueue(depth=self.settings.pipeline_depth,
                               share=(lambda item: item[0], share))
        self.echoes = {name: Echoes() for name in self.controllers}
        self.inflight = {name: InFlight() for name in self.controllers}
        #: Changes (handler, uid, resourceVersion, change) the router's watch started runs for.
        self._acted: Recent[tuple[Any, ...], bool] = Recent(MAX_REMEMBERED)
        #: Per key, the end of its latest run (runs of a key finish in the order they began).
        self._ends: dict[Item, threading.Event] = {}
        self._ends_lock = threading.Lock()
        self.writers = {name: KubeWriter(kube.for_manager(c.field_manager), self.cache,
                                         self.echoes[name])
                        for name, c in self.controllers.items()}
        self.kube = kube
        self.catchup = CatchUp(self.cache, kube, lambda: self.settings.cache_wait)
        self._pool = ThreadPoolExecutor(self.settings.write_concurrency,
                                        thread_name_prefix="engine-write")
        self._seen: dict[Item, _Seen] = {}
        #: Runs to check their parent with the API server first (see _parent_gone).
        self._verify: set[Item] = set()
        #: Runs after writes in a row, per key (see ``_work``).
        self._followups: dict[Item, int] = {}
        self._conflicts: dict[str, set[str]] = {}
        #: Objects at a child's name that a parent does not own (handler, kind, namespace,
        #: name) -> the parents it is in the way of: their change or deletion runs them at
        #: once. Nothing else maps them to it (no ownerReference, no label), and its retries
        #: back off to 5 minutes. (A set: a user's handler may give two parents one name.)
        self._squatters: dict[tuple[str, str, str, str], set[Key]] = {}
        self._squatting: dict[Item, set[tuple[str, str, str, str]]] = {}
        self._squatters_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        #: Set once every controller's parents were queued for their first run.
        self.started = threading.Event()
        #: With ``leader_elect``: the watch starts runs only while this holds the Lease.
        lease, deadline, retry = self.settings.lease_timing
        self.elector = LeaderElector(kube, ROUTER_LEASE, default_namespace(),
                                     default_identity(), lease_seconds=lease,
                                     renew_deadline=deadline, retry_period=retry) \
            if self.settings.run_on_watch and self.settings.leader_elect else None
        self._campaign: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Engine:
        if self.settings.run_on_watch:
            self.cache.listen(self._on_watch)
        if self.elector is not None:
            self._campaign = self.elector.campaign(self._stop, on_lead=self._lead)
        self.cache.start()
        for i in range(self.settings.workers):
            t = threading.Thread(target=self._work, name=f"engine-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._initial_runs, name="engine-start", daemon=True)
        t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.queue.close()
        self.cache.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._campaign is not None and self.elector is not None:
            self._campaign.join(self.elector.retry_period + 10)  # the lease handed back

    def _initial_runs(self) -> None:
        """Every parent once its controller's caches synced: what happened while no router
        ran is caught up with, as a controller does at start."""
        pending = set(self.controllers)
        while pending and not self._stop.is_set():
            for name in sorted(pending):
                ctl = self.controllers[name]
                if self._state(ctl)[0] == "ready":
                    pending.discard(name)
                    self._queue_all(ctl)
            if pending:
                self._stop.wait(0.2)
        self.started.set()

    def _lead(self) -> None:
        """Just took the Lease: every parent once. What this replica's watch saw while
        another led started no run here, and that leader may have died before running it
        (else it waits for the watcher to deliver it again, 35 s in a reviewer's failover)."""
        for ctl in self.controllers.values():
            if self._state(ctl)[0] == "ready":
                self._queue_all(ctl)

    def _queue_all(self, ctl: Controller, store: Store | None = None) -> None:
        """A run of every parent ``store`` holds (default: the synced cache's)."""
        store = store if store is not None else self._store(*ctl.parent.key)
        for parent in store.items() if store is not None else ():
            self._add(ctl, Key.of(parent), None)

    # -- readiness -------------------------------------------------------------------

    def _state(self, ctl: Controller) -> tuple[str, list[str]]:
        """``ready``, ``missing`` (CRDs not installed: named) or ``syncing`` (named)."""
        missing, syncing = [], []
        for k in ctl.kinds():
            informer = self.cache.informer(*k.key)
            if informer is None or k.optional:
                continue
            if informer.missing:
                missing.append(str(k))
            elif not informer.synced:
                syncing.append(str(k))
        if missing:
            return "missing", missing
        return ("syncing", syncing) if syncing else ("ready", [])

    def _synced_state(self, ctl: Controller) -> tuple[str, list[str]]:
        """:meth:`_state`, after waiting (bounded) for caches still syncing: an event that
        arrives while the router starts waits for them instead of failing."""
        state, kinds = self._state(ctl)
        if state == "syncing":
            self.cache.wait_synced(self.settings.cache_wait,
                                   [k.key for k in ctl.kinds() if not k.optional
                                    and self.cache.informer(*k.key) is not None])
            state, kinds = self._state(ctl)
        return state, kinds

    def readiness(self) -> tuple[bool, str]:
        """Ready once every handler whose CRDs are installed has its caches synced; a
        handler waiting for a CRD is named but does not hold the others back."""
        waiting, syncing = [], []
        for ctl in self.controllers.values():
            state, kinds = self._state(ctl)
            if state == "missing":
                waiting.append(f"{ctl.name} waits for {', '.join(kinds)} to be served "
                               f"({_why_missing(kinds)})")
            elif state == "syncing":
                syncing.append(f"{ctl.name} ({', '.join(kinds)})")
        if syncing:
            return False, "caches not synced yet: " + "; ".join(syncing)
        return True, "; ".join(["caches synced", *waiting])

    # -- events in -------------------------------------------------------------------

    def submit(self, event: Event) -> tuple[Ticket, dict[str, str]]:
        """Queue the runs an event asks for. Returns the ticket to wait on and, per handler
        that had nothing to run, why (an echo, an unchanged parent, a CRD not installed).
        Raises :class:`CacheBehind` when the cache could not catch up with the event,
        :class:`InvalidEvent` when it names an object no API server could send."""
        ticket, notes = Ticket(), {}
        try:
            if event.is_kube:
                self._submit_change(event, ticket, notes)
            else:
                for ctl in self.controllers.values():
                    if self._state(ctl)[0] != "ready":
                        continue
                    keys = ctl.keys_for_event(event, self._reads(ctl))
                    if keys is not None and not keys:
                        # Its trigger ran: an answer of its own, not "no handler wants it"
                        # (a refresh before the first ExchangeRate is not a mistyped type).
                        notes[ctl.name] = f"no {ctl.parent.kind} to run for"
                    for key in keys or ():
                        self._add(ctl, key, ticket)
        finally:
            ticket.seal()
        return ticket, notes

    def validate(self, event: Event) -> None:
        """Raise :class:`InvalidEvent` when the event names an object no API server could
        send: a namespaced kind without a namespace, a cluster-scoped one with one (as far
        as the cache knows the kind). The router asks before any handler runs, so an event
        answered 400 has run nothing."""
        ref = event.ref
        store = self._store(ref.api_version, ref.kind) if ref is not None else None
        if ref is None or store is None or store.namespaced == bool(ref.namespace):
            return
        # Looked up as it is, it would be "gone" (or found in some other namespace).
        raise InvalidEvent(
            f"the event names {ref.kind} {ref.name!r} without a namespace, but "
            f"{ref.kind} is namespaced" if store.namespaced else
            f"the event names {ref.kind} {ref.name!r} in namespace {ref.namespace!r}, "
            f"but {ref.kind} is cluster-scoped")

    def _submit_change(self, event: Event, ticket: Ticket, notes: dict[str, str]) -> None:
        ref = event.ref
        if ref is None:
            return
        kind = (ref.api_version, ref.kind)
        interested = [c for c in self.controllers.values()
                      if any(k.key == kind for k in c.event_kinds())]
        if not interested:
            return
        ready = []
        for ctl in interested:
            state, kinds = self._synced_state(ctl)
            if state == "missing":
                informer = self.cache.informer(*kind)
                if informer is not None:  # this event says the kind is served now
                    informer.look_again()
                if kind == ctl.parent.key:
                    raise CacheBehind(f"{ctl.name} got a {ref.kind} event but its "
                                      f"CustomResourceDefinition is not served yet")
                notes[ctl.name] = f"waiting for the CustomResourceDefinition of {kinds[0]}"
            else:
                ready.append(ctl)
        if not ready:
            return
        self.validate(event)
        subject, since = self.catchup.caught_up(event, kind)
        uid, rv = ref.uid, ref.resource_version
        for ctl in ready:
            # The first event of a change the watch acted on may take that run's result (a
            # delete was verified there); its resync or redelivery gets a run of its own.
            acted = bool(self._acted.pop((ctl.name, uid, rv, event.change), False))
            for key in self._keys(ctl, kind, event.change or "", subject, uid, rv, notes,
                                  consume=True, verify=not acted):
                self._add(ctl, key, ticket, since, finished=acted)

    def _keys(self, ctl: Controller, kind: tuple[str, str], change: str, subject: Obj,
              uid: str | None, rv: str | None, notes: dict[str, str], *, consume: bool,
              verify: bool) -> set[Key]:
        """The keys of ``ctl`` a change maps to: none for the echo of its own write (the
        echo is forgotten once ``consume``d: the event, not the watch, does that) or for a
        parent whose update changed nothing it could react to."""
        if self.echoes[ctl.name].is_echo(uid, rv, change, consume=consume):
            if consume:
                REQUESTS.labels(ctl.name, "echo").inc()
                notes[ctl.name] = ECHO
            return set()
        store = self._store(*ctl.parent.key)
        changed = self._store(*kind) if change == "update" else None
        keys = ctl.keys_for(subject, self._reads(ctl),
                            parent_namespaced=bool(store and store.namespaced),
                            former_owner=changed.former_owner(uid) if changed else None)
        if self._squatters:
            meta = subject.get("metadata") or {}
            with self._squatters_lock:
                squatted = set(self._squatters.get((ctl.name, str(subject.get("kind")),
                                                    meta.get("namespace") or "",
                                                    str(meta.get("name"))), ()))
            keys = keys | squatted
        if kind == ctl.parent.key and change == "update":
            keys = {k for k in keys if not self._unchanged(ctl, k, subject)}
            if not keys:
                if consume:
                    REQUESTS.labels(ctl.name, "unchanged").inc()
                notes[ctl.name] = STATUS_ONLY
        if verify and change == "delete" and any(k.key == kind for k in ctl.owns) \
                and not self._namespace_going((subject.get("metadata") or {}).get("namespace")):
            # (a child taken by its namespace's deletion: nothing could be written there
            # again, so there is nothing to verify: no lookup per copy of a namespace)
            self._verify.update((ctl.name, key) for key in keys)
        return keys

    def _on_watch(self, spec: InformerSpec, change: str, obj: Obj) -> None:
        """A change the cache's own watch brought: its runs start now, without waiting for
        the watcher's event about it (which then finds them under way or done, see
        ``WorkQueue.add``). The event stays what guarantees the change is acted upon."""
        kind = (spec.api_version, spec.kind)
        if change == SERVED_AGAIN:
            # Runs dropped while the kind was not served (see _run): every parent once, as
            # at start (every replica: the runs of events are everyone's). Called as the
            # list ends, before the informer counts as synced: its store is read directly,
            # and each run waits for the sync as any run does.
            for ctl in self.controllers.values():
                informer = self.cache.informer(*ctl.parent.key)
                if any(k.key == kind for k in ctl.kinds()) and informer is not None:
                    self._queue_all(ctl, informer.store)
            return
        if self.elector is not None and not self.elector.is_leader:
            return  # another replica's watch starts the runs
        meta = obj.get("metadata") or {}
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        for ctl in self.controllers.values():
            if not any(k.key == kind for k in ctl.event_kinds()) \
                    or self._state(ctl)[0] != "ready" or self.writers[ctl.name].writing(obj):
                continue  # (a write of it under way: maybe its echo, left to the event)
            keys = self._keys(ctl, kind, change, obj, uid, rv, {}, consume=False, verify=True)
            if keys:
                self._acted.put((ctl.name, uid, rv, change), True)
            for key in keys:
                self._add(ctl, key, None)

    def _parent_gone(self, ctl: Controller, key: Key, parent: Obj) -> bool:
        """A child was deleted: by a person (recreate it), or by the garbage collector
        because the parent went (do nothing). The parent's own deletion may not have reached
        the cache yet (its watch and the child's are independent), so before recreating
        anything the API server is asked, once per run, whether the parent is still there."""
        meta = self.catchup.read_meta(ctl.parent.api_version, ctl.parent.kind,
                                      key.namespace or None, key.name)
        return meta is None or meta.get("uid") != parent["metadata"].get("uid") \
            or bool(meta.get("deletionTimestamp"))

    def _unchanged(self, ctl: Controller, key: Key, parent: Obj) -> bool:
        seen = self._seen.get((ctl.name, key))
        return (seen is not None and seen.status == parent.get("status")
                and seen.fingerprint == fingerprint(parent))

    def _add(self, ctl: Controller, key: Key, ticket: Ticket | None,
             since: float | None = None, *, finished: bool = False) -> None:
        before = self.queue.merged
        self.queue.add((ctl.name, key), ticket, since, finished=finished)
        REQUESTS.labels(ctl.name, "merged" if self.queue.merged > before else "queued").inc()

    # -- runs ------------------------------------------------------------------------

    def _store(self, api_version: str, kind: str) -> Store | None:
        return self.cache.store(api_version, kind)

    def _reads(self, ctl: Controller, parent: Obj | None = None) -> Reads:
        return Reads(self._store, ctl.kinds(), ctl.name, parent)

    def _namespace_going(self, namespace: str | None) -> bool:
        """The cache holds the namespace as terminating, or held it and holds it no more."""
        store = self._store("v1", "Namespace")
        if not namespace or store is None:
            return False
        found = store.get(None, namespace)
        return found is None or is_terminating(found)

    def _unseen_namespace(self, ctl: Controller, namespace: str) -> bool:
        """The controller reads Namespaces, the cache keeps every one of them (no label
        selector), and it does not hold this one: the function decided without it."""
        if not any(k.key == ("v1", "Namespace") for k in ctl.kinds()):
            return False
        informer = self.cache.informer("v1", "Namespace")
        if informer is None or informer.spec.selector:
            return False
        store = self._store("v1", "Namespace")
        return store is not None and store.get(None, namespace) is None

    def _terminating(self, namespace: str) -> bool:
        store = self._store("v1", "Namespace")
        return is_terminating(store.get(None, namespace) if store is not None else None)

    def _work(self) -> None:
        while not self._stop.is_set():
            item = self.queue.get()
            if item is None:
                return
            name, key = item
            with self._ends_lock:
                before, end = self._ends.get(item), threading.Event()
                self._ends[item] = end
            start = time.perf_counter()
            released: list[bool] = []
            try:
                ran = self._run(self.controllers[name], key, before, end, released)
                followups = self._followups.pop(item, 0)
                # A follow-up completes the run before it, which wrote (``again``): an
                # event of that change may be answered with the follow-up's result, and
                # must not read as a resync's (quiet) then.
                result = Result(item, True, ran.detail, None, time.perf_counter() - start,
                                ran.quiet and not followups)
                RUNS.labels(name, "ok").inc()
                if ran.retry:
                    self.queue.retry(item, cap=ran.cap)
                else:
                    self.queue.forget(item)
                if ran.requeue:
                    self.queue.add_after(item, ran.requeue)
                if ran.again and followups < MAX_FOLLOWUPS:
                    # The status was worked out before the writes, and their echoes cost no
                    # run: one more run, over the cache that now holds what was written and
                    # the parent with that status, brings it up to date (and takes the next
                    # step, if the writes made one possible). Bounded, so a function that
                    # writes on every run (a field the API server keeps rewriting) can not
                    # loop: it gets MAX_FOLLOWUPS more runs per change, then waits for one.
                    self._followups[item] = followups + 1
                    self.queue.add(item)
            except Exception as exc:
                delay = self.queue.retry(item, cap=retry_cap([exc]))
                RUNS.labels(name, "error").inc()
                # A cache catching up (a CRD being installed, a watch resuming) is a wait,
                # not a failure: a warning, as the router logs it for an event. A run cut
                # short by the router stopping (its writes cancelled) is neither.
                stopping = self._stop.is_set() and isinstance(
                    exc, CancelledError | errors.Unavailable)
                expected = stopping or isinstance(exc, errors.KubeError | LookupError
                                                  | ValueError)
                level = logging.INFO if stopping else (
                    logging.WARNING if isinstance(exc, CacheBehind) else logging.ERROR)
                log.log(level, "%s %s failed, retried in %.1fs: %s: %s", name, key, delay,
                        type(exc).__name__, exc, exc_info=not expected,
                        extra={"fields": {"handler": name, "key": str(key)}})
                result = Result(item, False, f"{type(exc).__name__}: {exc}", exc,
                                time.perf_counter() - start)
            if before is not None:
                before.wait()  # the queue finishes the runs of a key in the order they began
            self.queue.done(result, released=bool(released))
            end.set()
            with self._ends_lock:
                if self._ends.get(item) is end:
                    del self._ends[item]

    def _remember_squatters(self, ctl: Controller, key: Key, conflicts: list[Conflict]) -> None:
        """This run's conflicts are the objects whose change runs ``key`` again."""
        slots = {(ctl.name, c.kind, c.namespace, c.name) for c in conflicts}
        item = (ctl.name, key)
        with self._squatters_lock:
            for slot in self._squatting.pop(item, set()) - slots:
                parents = self._squatters.get(slot, set())
                parents.discard(key)
                if not parents:
                    self._squatters.pop(slot, None)
            if slots:
                self._squatting[item] = slots
                for slot in slots:
                    self._squatters.setdefault(slot, set()).add(key)

    def _run(self, ctl: Controller, key: Key, before: threading.Event | None,
             end: threading.Event, released: list[bool]) -> _Ran:
        """One run of ``key``; ``before`` is set when the run before it has finished,
        ``end`` is set by the caller when this one has; ``released`` gets True once this
        run's writes are sent and the next run of the key may start."""
        state, kinds = self._synced_state(ctl)
        if state == "missing" and str(ctl.parent) in kinds:
            # Its CRD was deleted, and every parent with it: nothing to run, nor to retry
            # (ERRORs every few minutes, for good). Served again (installed again, or after
            # a 404 in passing), its list runs every parent (SERVED_AGAIN, _on_watch).
            return _Ran(f"{key}: {ctl.parent} is not served (its CustomResourceDefinition "
                        "was deleted?): nothing to run until it is")
        if state != "ready":
            raise CacheBehind(f"{ctl.name}: {state} {', '.join(kinds)}")
        store = self._store(*ctl.parent.key)
        assert store is not None
        parent = store.get(key.namespace or None, key.name)
        item = (ctl.name, key)
        if item in self._verify:
            self._verify.discard(item)
            if parent is not None and not parent["metadata"].get("deletionTimestamp") \
                    and self._parent_gone(ctl, key, parent):
                return _Ran(f"{key}: a child was deleted and {ctl.parent.kind} {key} is gone "
                            "or going (asked the API server): nothing to restore")
        seen = fingerprint(parent) if parent is not None else ""

        def settle() -> Obj | None:
            if before is not None:
                before.wait()
            return store.get(key.namespace or None, key.name)

        def dispatched() -> None:
            if not released:
                released.append(True)
                self.queue.release(item)

        pipeline = Pipeline(self.inflight[ctl.name], dispatched, settle,
                            lambda: self._ends.get(item) is not end)
        result = run(ctl, key, parent, self._reads(ctl, parent), self.writers[ctl.name],
                     submit=self._pool.submit, terminating=self._terminating,
                     unseen=lambda ns: self._unseen_namespace(ctl, ns),
                     seen_conflicts=self._conflicts,
                     pipeline=pipeline if ctl.overlap else None)
        self._remember_squatters(ctl, key, result.squatters)
        if before is not None:
            before.wait()  # what the earlier runs saw is older than what this one saw
        after = store.get(key.namespace or None, key.name)
        if after is None:
            last = self._seen.pop((ctl.name, key), None)
            # Gone: what was reported about it (conflicts, refusals) is forgotten too.
            for uid in (last.uid if last else None, (parent or {}).get("metadata", {}).get("uid")):
                if uid:
                    self._conflicts.pop(str(uid), None)
        else:
            self._seen[(ctl.name, key)] = _Seen(seen, after.get("status"),
                                                str(after["metadata"].get("uid", "")))
        log.debug("%s %s: %s", ctl.name, key, result.summary)
        return _Ran(f"{key}: {result.summary}", result.retry or result.unsettled,
                    result.retry_cap, result.requeue_after, result.status_before_writes,
                    result.quiet)


def _why_missing(kinds: list[str]) -> str:
    """What a kind the API server does not serve most likely means: a CRD to install, an
    add-on's API, or (a kind of a dotless built-in group, which no CRD can add to) a typo."""
    api_versions = [k.rpartition("/")[0] for k in kinds]
    if any(is_custom(v) for v in api_versions):
        return "a CustomResourceDefinition to install, e.g. kubectl apply -k crds/?"
    if all(is_builtin_group(v) for v in api_versions):
        return ("no CustomResourceDefinition can add a kind to a built-in group: check its "
                "spelling in the handler's owns=/reads=")
    return "an API this server does not enable, or an add-on's not installed"
