"""Carry out a :class:`~eventop.engine.plan.Plan`: the writes, in parallel, and what they did.

A fan-out (one source copied into 1,000 namespaces) is 1,000 independent writes: they go
through a bounded thread pool, so the run takes about as long as the slowest few writes
instead of their sum, and the API server sees a bounded number of requests at once.

Runs of one parent overlap (see ``engine/queue.py``: the next run starts once this one's
writes are sent): :class:`InFlight` remembers each child's write until it ends, so a later
run that wants the very same write waits for it instead of sending it again, and one that
wants another write of that child sends it only after the first has ended.

Each write's failure is the child's, not the run's: a refused write (403, 422, a field
conflict) is recorded in the :class:`~eventop.engine.desired.Outcome` and the others go
on. Only an unavailable API server fails the run (after the other writes finished), so
that it is retried; one found unreachable (no answer at all) stops the run's writes not
sent yet (:class:`_FailFast`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, cast

from eventop.engine.controller import CREATED_ANNOTATION
from eventop.engine.desired import Conflict, Note, Outcome, WriteError
from eventop.engine.plan import Action, Plan, held_back, in_sync, is_ours, replacement
from eventop.kube import errors
from eventop.kube.recent import Recent

log = logging.getLogger("eventop.engine")
#: A refusal logged at warning is logged again only at debug for this long (seconds) while
#: it keeps coming back the same: a grant removed from 30 copies is 30 lines, not 30 lines
#: on every retry. Its status condition and Event say it all along.
REFUSAL_LOG_SECONDS = 300.0
_refusals_logged: Recent[tuple[str, str, str, str], tuple[int, float]] = Recent(4096)

Obj = dict[str, Any]


class Writer(Protocol):
    """The API calls the engine makes, under one handler's field manager."""

    def create(self, obj: Obj) -> Obj: ...
    def apply(self, obj: Obj, *, force: bool, existing: Obj | None = None) -> Obj: ...
    def replace(self, obj: Obj) -> Obj: ...
    def delete(self, obj: Obj) -> bool: ...
    def patch(self, obj: Obj, resource_version: str) -> Obj: ...
    def read(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None: ...
    def read_after_conflict(self, obj: Obj, tried: str | None) -> Obj | None: ...
    def patch_status(self, parent: Obj, status: Obj) -> Obj: ...
    def set_finalizer(self, parent: Obj, finalizer: str, present: bool) -> Obj: ...
    def post_event(self, parent: Obj, note: Note) -> None: ...


Slot = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


@dataclass(frozen=True)
class Sent:
    """A write in flight: which, and its future ((Outcome field, value))."""

    verb: str
    body: Obj | None
    future: Future[Any]

    def same(self, action: Action) -> bool:
        """Is ``action`` this very write (a later run that computed the same thing)?"""
        if self.verb != action.verb:
            return False
        if action.verb == "delete":
            return (self.body or {}).get("metadata", {}).get("uid") == \
                ((action.existing or {}).get("metadata") or {}).get("uid")
        return self.body == action.desired


class InFlight:
    """The writes of one handler that are in flight, by child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[Slot, Sent] = {}

    def snapshot(self) -> dict[Slot, Sent]:
        """The writes in flight now. Taken before a run reads the cache: a write that ends
        after that read has its result written through to the cache too late for the run,
        so the run must learn of it from here."""
        with self._lock:
            return dict(self._sent)

    def get(self, slot: Slot) -> Sent | None:
        with self._lock:
            return self._sent.get(slot)

    def put(self, slot: Slot, sent: Sent) -> None:
        with self._lock:
            self._sent[slot] = sent
        sent.future.add_done_callback(lambda _f: self._ended(slot, sent))

    def _ended(self, slot: Slot, sent: Sent) -> None:
        with self._lock:
            if self._sent.get(slot) is sent:
                del self._sent[slot]

    def __len__(self) -> int:
        with self._lock:
            return len(self._sent)


class StaleWrite(Exception):
    """A write lost a race with another writer (a replace twice: the object keeps changing;
    a delete of a version that changed since it was read): the run is retried. Its
    :class:`WriteError` has this ``reason``: not a refusal to report, it mends itself."""

    reason = "StaleWrite"


class _FailFast:
    """A run's writer that stops sending once the API server is found unreachable (no
    answer at all, :class:`~eventop.kube.errors.Unreachable`): every write of the run still
    to be sent fails at once with the same error, instead of each trying on its own (a
    fan-out of 200 copies sent 200 requests into an outage on every retry of the run: 1,500
    in 13 s, a user's trial). The run is retried with backoff. A 5xx answer does not trip
    it: it may concern one object only (a webhook failing in one namespace), and the other
    writes go on."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._down: errors.Unreachable | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._writer, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._down is not None:
                raise self._down
            try:
                return attr(*args, **kwargs)
            except errors.Unreachable as exc:
                self._down = exc
                raise
        return call


def execute(plan: Plan, writer: Writer, parent: Obj, *,
            submit: Callable[..., Any] | None = None, inflight: InFlight | None = None,
            prior: dict[Slot, Sent] | None = None,
            dispatched: Callable[[], None] | None = None) -> Outcome:
    """Make every write of ``plan`` for ``parent``; ``submit`` (an Executor's, first in
    first out) runs them in parallel. With ``inflight`` (and ``prior``, its snapshot taken
    before the plan was computed), a write an earlier run has in flight is not sent twice;
    ``dispatched`` is called once every write is sent, before waiting for them."""
    if not isinstance(writer, _FailFast):
        writer = cast(Writer, _FailFast(writer))
    if any(a.adopt for a in plan.actions) and not _still_alive(writer, parent):
        plan = Plan([a for a in plan.actions if not a.adopt], plan.unchanged, plan.conflicts,
                    plan.skipped + [a.existing for a in plan.actions
                                    if a.adopt and a.existing is not None])
    first = _namespaces_first(plan)
    if first:
        # A Namespace this run creates comes before the children it creates in it, which
        # would otherwise race it (404: the namespace does not exist yet).
        made = execute(Plan(first), writer, parent, submit=submit, inflight=inflight,
                       prior=prior)
        # A Namespace whose create found it there (someone made it meanwhile) or was
        # refused is not this parent's: nothing goes into it (see plan's hold-back).
        missed = {c.name for c in made.conflicts if c.kind == "Namespace"} | {
            e.name for e in made.errors if e.kind == "Namespace"}
        rest, held = held_back([a for a in plan.actions if a not in first], missed,
                               "was not made by this parent")
        others = execute(Plan(rest, plan.unchanged, plan.conflicts + held, plan.skipped),
                         writer, parent, submit=submit, inflight=inflight, prior=prior,
                         dispatched=dispatched)
        return others.after(made)
    parent_uid = str(parent["metadata"]["uid"])
    outcome = Outcome(unchanged=list(plan.unchanged), conflicts=list(plan.conflicts),
                      skipped=list(plan.skipped))
    if submit is not None and inflight is not None:
        sent = [_send(a, writer, parent_uid, submit, inflight, prior or {})
                for a in plan.actions]
        if dispatched is not None:
            dispatched()
        results = [_borrowed(_wait(f)) if borrowed else _wait(f) for f, borrowed in sent]
    elif submit is not None and len(plan.actions) > 1:
        futures = [submit(_one, a, writer, parent_uid) for a in plan.actions]
        results = [_wait(f) for f in futures]
    else:
        results = [_capture(_one, a, writer, parent_uid) for a in plan.actions]
    unavailable: BaseException | None = None
    stale = False
    for action, (result, exc) in zip(plan.actions, results, strict=True):
        if exc is not None:
            if isinstance(exc, StaleWrite):
                stale = True
                outcome.errors.append(_error(action, exc, 409))
            elif isinstance(exc, errors.Unavailable):
                unavailable = unavailable or exc
            else:
                raise exc
            continue
        category, value = result
        getattr(outcome, category).append(value)
    if unavailable is not None:
        raise unavailable
    outcome.conflicts.sort(key=lambda c: (c.kind, c.namespace, c.name))
    outcome.retry = stale
    return outcome


def _namespaces_first(plan: Plan) -> list[Action]:
    """The Namespace creates of ``plan`` that another of its writes goes into."""
    into = {a.namespace for a in plan.actions if a.namespace}
    return [a for a in plan.actions
            if a.verb in ("create", "recreate") and a.kind == "Namespace" and a.name in into
            and (a.desired or {}).get("apiVersion") == "v1"]


def _still_alive(writer: Writer, parent: Obj) -> bool:
    """Re-read the parent from the API server before adopting anything (as Kubernetes'
    ControllerRefManager does): a cache may not show yet that it is being deleted, and an
    object adopted by a parent on its way out would be garbage-collected with it."""
    meta = parent["metadata"]
    fresh = writer.read(parent["apiVersion"], parent["kind"], meta["name"], meta.get("namespace"))
    return bool(fresh and fresh["metadata"].get("uid") == meta.get("uid")
                and not fresh["metadata"].get("deletionTimestamp"))


def _slot(action: Action) -> Slot:
    body = action.desired or action.existing or {}
    return (str(body.get("apiVersion")), action.kind, action.namespace, action.name)


def _send(action: Action, writer: Writer, parent_uid: str, submit: Callable[..., Any],
          inflight: InFlight, prior: dict[Slot, Sent]) -> tuple[Future[Any], bool]:
    """Submit one write, unless an earlier run has this very write in flight (then its
    future, borrowed). Another write of the same child waits for the earlier one first (the
    pool is first in first out: the earlier write is running or ahead in the queue)."""
    slot = _slot(action)
    earlier = inflight.get(slot) or prior.get(slot)
    if earlier is not None and earlier.same(action):
        return earlier.future, True
    before = earlier.future if earlier is not None else None
    future = submit(_after, before, action, writer, parent_uid)
    inflight.put(slot, Sent(action.verb, action.desired or action.existing, future))
    return future, False


def _after(before: Future[Any] | None, action: Action, writer: Writer,
           parent_uid: str) -> tuple[str, Any]:
    if before is not None:
        _wait(before)
    return _one(action, writer, parent_uid)


def _borrowed(result: tuple[Any, BaseException | None]) -> tuple[Any, BaseException | None]:
    """An earlier run's write, as this run counts it: what it created or updated is in
    place (unchanged by this run); a refusal or a deletion counts as it was."""
    value, exc = result
    if exc is None and value[0] in ("created", "updated"):
        return ("unchanged", value[1]), None
    return value, exc


def _wait(future: Any) -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except BaseException as exc:  # re-raised by execute after all writes finished
        return None, exc


def _capture(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args), None
    except Exception as exc:
        return None, exc


def _one(action: Action, writer: Writer, parent_uid: str) -> tuple[str, Any]:
    """One write, logged; returns (Outcome field, value). Refusals become WriteErrors."""
    category, value = _write(action, writer, parent_uid)
    if category in ("created", "updated", "deleted"):
        done = {"created": "created", "deleted": "deleted",
                "updated": "recreated" if action.verb == "recreate" else "updated"}[category]
        why = f" {action.child.reason}" if action.child is not None and action.child.reason \
            else ""
        where = f"{action.namespace}/{action.name}" if action.namespace else action.name
        log.info("%s %s %s%s", done, action.kind, where, why)
        _refusals_logged.pop((action.verb, action.kind, action.namespace, action.name))
    elif category == "errors":
        slot = (action.verb, action.kind, action.namespace, action.name)
        status, now = int(getattr(value, "status", 0) or 0), time.monotonic()
        last = _refusals_logged.get(slot)
        again = last is not None and last[0] == status and now - last[1] < REFUSAL_LOG_SECONDS
        if not again:
            _refusals_logged.put(slot, (status, now))
        log.log(logging.DEBUG if again else logging.WARNING,
                "the API server refused to %s: %s (tried again with backoff%s)", action.verb,
                value, "" if again else "; the same refusal again is logged at debug for "
                f"{REFUSAL_LOG_SECONDS:.0f} s")
    return category, value


def _write(action: Action, writer: Writer, parent_uid: str) -> tuple[str, Any]:
    try:
        if action.verb == "delete":
            return ("deleted" if _delete(action, writer) else "gone"), action.existing
        if action.verb == "create":
            return _create(action, writer, parent_uid)
        if action.verb == "patch":
            return "updated", _patch(action, writer)
        if action.verb == "recreate":
            assert action.desired is not None
            _delete(action, writer)
            return _create(action, writer, parent_uid, category="updated")
        return "updated", _update(action, writer, action.existing)
    except errors.Unavailable:
        raise
    except errors.Forbidden as exc:
        if _terminating(exc):
            return "skipped", action.desired or action.existing
        return "errors", _error(action, exc, exc.status)
    except errors.KubeError as exc:
        return "errors", _error(action, exc, exc.status)


def _delete(action: Action, writer: Writer) -> bool:
    """Delete exactly the version the plan was made from (uid and resourceVersion
    preconditions): an object changed since, perhaps taken over by someone who removed our
    ownerReference while the cache had not seen it yet, is not deleted; the run is repeated
    on a fresh read. False if it was gone already (another replica deleted it)."""
    assert action.existing is not None
    try:
        return writer.delete(action.existing)
    except errors.Conflict as exc:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} changed since it "
                         f"was read: not deleted ({exc})") from exc


def _patch(action: Action, writer: Writer) -> Obj:
    """Merge-patch the fields into exactly the version the plan saw (resourceVersion
    precondition): changed since, the run is repeated on the newer version."""
    assert action.desired is not None and action.existing is not None
    try:
        return writer.patch(action.desired, str(action.existing["metadata"]["resourceVersion"]))
    except errors.Conflict as exc:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} changed since it "
                         f"was read: not patched ({exc})") from exc


def _create(action: Action, writer: Writer, parent_uid: str,
            category: str = "created") -> tuple[str, Any]:
    """POST; if the name is taken, it is ours to update (another replica made it) or a
    conflict, never merged into."""
    assert action.desired is not None and action.child is not None
    body = action.desired
    if action.child.mode in ("apply", "create"):  # a first apply hands the POST's fields over
        meta = body["metadata"]
        body = {**body, "metadata": {**meta, "annotations": {
            **(meta.get("annotations") or {}), CREATED_ANNOTATION: "true"}}}
    try:
        return category, writer.create(body)
    except errors.NotFound as exc:
        # Its namespace does not exist (gone meanwhile, or never made): a refusal to report,
        # and the run is tried again (see RunResult.unsettled), not a silent skip.
        return "errors", _error(action, exc, 404)
    except errors.Conflict:
        pass
    current = writer.read_after_conflict(action.desired, None)
    if current is None:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} existed at create "
                         "and was gone right after")
    if current["metadata"].get("deletionTimestamp"):
        # Deleted, held by a finalizer (a recreate's delete, or anyone's): it is going, so
        # neither ours to update (an immutable one would be refused) nor a conflict. Made
        # again by a later run, once it is gone.
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} is still being "
                         "deleted: made again once it is gone")
    if not is_ours(current, parent_uid):
        return "conflicts", Conflict(action.kind, action.namespace, action.name,
                                     "created by someone else meanwhile")
    if action.child.mode == "create" or in_sync(action.child, current, action.desired):
        return "unchanged", current
    # Made meanwhile (by another replica) from what it read, perhaps newer than what this run
    # read: not overwritten with this run's older view; the run is repeated on a fresh one.
    raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} was made by another "
                     "writer meanwhile, differently: the run is repeated on a fresh read")


def _update(action: Action, writer: Writer, existing: Obj | None) -> Obj:
    assert action.desired is not None and action.child is not None and existing is not None
    if action.child.mode != "replace":
        return writer.apply(action.desired, force=action.child.force, existing=existing)
    try:
        return writer.replace(replacement(existing, action.desired))
    except errors.Conflict:
        pass  # changed since the cache saw it: once more from a fresher view
    fresh = writer.read_after_conflict(action.desired,
                                       existing["metadata"].get("resourceVersion"))
    if fresh is None:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} went away")
    if in_sync(action.child, fresh, action.desired):
        return fresh
    # Changed by another writer since this run read it: another router replica, perhaps from
    # a newer source than this run read (a copy would then go back to older data for a
    # moment, as a reviewer saw with two replicas in a burst). Not overwritten with what this
    # run worked out; the run is repeated on a fresh view.
    raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} changed since it was "
                     "read: the run is repeated on a fresh view")


def _terminating(exc: errors.KubeError) -> bool:
    return "terminat" in str(exc).lower()


def _error(action: Action, exc: BaseException, status: int) -> WriteError:
    message = getattr(exc, "message", None) or str(exc)
    return WriteError(action.verb, action.kind, action.namespace, action.name,
                      one_line(message), status, str(getattr(exc, "reason", "") or ""))


#: Longest refusal message kept (a condition's or an Event's message, a log line).
MESSAGE_LIMIT = 1000


def one_line(message: str) -> str:
    """The API server's message on one line, whole: a field-manager conflict lists the
    fields, an RBAC escalation the rules not held, each on lines of their own after the
    first (``- .data.a``); the first line alone ends in a colon and says nothing."""
    parts = [line.strip().removeprefix("- ") for line in message.strip().splitlines()]
    text = " ".join(p for p in parts if p)
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"
