"""One run of a controller for one parent: call the pure function, write the differences,
then status, Events and the finalizer.

Order matters: the finalizer is added before any child is written (so no child exists that
a deletion could leave behind unfinalized), status is written after the children (so it
counts what is really in place), and Events only with a status change (so a parent stuck in
one state does not post an Event per event).

In the router, runs of one parent overlap (:class:`Pipeline`): the next starts once this
one's writes are sent. Status is then written in the order the runs started, and only by
the latest: a run that a later one has overtaken leaves the status to it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from eventop.engine.controller import FINALIZER_DOMAIN, Controller
from eventop.engine.desired import Conflict, Desired, Note, Outcome, WriteError
from eventop.engine.invalid import SpecError, invalid_spec
from eventop.engine.kinds import Key
from eventop.engine.plan import plan
from eventop.engine.queue import MAX_BACKOFF
from eventop.engine.reads import Reads
from eventop.engine.write import InFlight, Writer, execute, one_line
from eventop.kube import errors, now_rfc3339
from eventop.kube.objects import status_changed

#: A run refused by the API server's authorization (403: an RBAC grant missing, removed, not
#: yet in place) backs off to at most this many seconds, not MAX_BACKOFF: what mends it, a
#: grant applied again, sends no event, so the next try is what takes it up. One refused
#: request per key per half minute.
REFUSED_RETRY_CAP = 30.0


def retry_cap(failures: Iterable[BaseException]) -> float | None:
    """The longest the next try of a run may wait after these failures: REFUSED_RETRY_CAP
    if the API server's authorization refused any of them, else None (the queue's own
    backoff, up to MAX_BACKOFF)."""
    return REFUSED_RETRY_CAP if any(getattr(f, "status", 0) == 403 for f in failures) \
        else None


def _every(seconds: float) -> str:
    """``30 s``, ``5 minutes``: how often a retry comes round at most, in a message."""
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"


log = logging.getLogger("eventop.engine")

Obj = dict[str, Any]


@dataclass
class RunResult:
    """What a run did, for the event's answer, the log line and the queue."""

    key: Key
    summary: str
    outcome: Outcome | None = None
    requeue_after: float | None = None
    status_written: bool = False
    #: Some write lost a race: run again soon (with backoff), whatever the events say.
    retry: bool = False
    #: A child is not as desired (a conflict, a refused write): run again with growing
    #: backoff (up to MAX_BACKOFF; REFUSED_RETRY_CAP for a 403, see :attr:`retry_cap`), as
    #: controller-runtime and kopf retry a failed reconcile.
    #: What resolves it often sends no event this handler sees: an RBAC grant, an admission
    #: webhook fixed, a squatting object deleted, a namespace created.
    unsettled: bool = False
    #: The status was computed before this run's writes (a value, not a function of the
    #: outcome): a run reading the cache that holds them may find another one.
    status_before_writes: bool = False
    notes: list[Note] = field(default_factory=list)
    #: The run wrote nothing (no child, status, finalizer or Event), tried no write and found
    #: nothing new (a conflict it reported before may stand): a resync or redelivery of a
    #: converged parent. Logged at debug, not info.
    quiet: bool = False
    #: Objects in the way that the function reported itself (``Desired.blocked_by``), as
    #: conflicts: their change runs the parent again.
    blocked_by: list[Conflict] = field(default_factory=list)

    @property
    def squatters(self) -> list[Conflict]:
        """Every object at a child's name that is not the parent's: a change runs it again."""
        return [*(self.outcome.conflicts if self.outcome else []), *self.blocked_by]

    @property
    def retry_cap(self) -> float | None:
        """The longest the next try may wait (:func:`retry_cap` of the refused writes)."""
        return retry_cap(self.outcome.errors if self.outcome else ())


@dataclass
class Pipeline:
    """How a run overlaps with the runs of the same parent before and after it."""

    #: The handler's writes in flight (shared by all runs of its parents).
    inflight: InFlight
    #: Called once this run's writes are sent: the next run of the parent may start.
    dispatched: Callable[[], None]
    #: Waits until the runs of the parent started before this one have finished; returns
    #: the parent as the cache holds it now (None if gone).
    settle: Callable[[], Obj | None]
    #: Has a later run of the parent started? It writes the status then.
    overtaken: Callable[[], bool]


def run(ctl: Controller, key: Key, parent: Obj | None, reads: Reads, writer: Writer, *,
        submit: Callable[..., Any] | None = None,
        terminating: Callable[[str], bool] = lambda _ns: False,
        unseen: Callable[[str], bool] = lambda _ns: False,
        seen_conflicts: dict[str, set[str]] | None = None,
        pipeline: Pipeline | None = None) -> RunResult:
    """Converge one parent. A :class:`~eventop.engine.invalid.SpecError` from the function is
    reported on the parent (see :mod:`eventop.engine.invalid`) and the run succeeds; other
    exceptions (the handler's, an unavailable API server) propagate: the caller answers the
    events 5xx and retries with backoff."""
    if parent is None:
        return RunResult(key, f"{ctl.parent.kind} {key} is gone; its owned children go with "
                              "it (garbage collection)")
    meta = parent["metadata"]
    finalizer = ctl.finalizer
    finalizers = meta.get("finalizers") or []
    deleting = bool(meta.get("deletionTimestamp"))
    stale = f"{FINALIZER_DOMAIN}/{ctl.name}"
    wrote_finalizer = False
    if finalizer is None and stale in finalizers:
        # Left by a version of the handler that had a @finalize function: nothing would
        # ever remove it, and the parent could never be deleted.
        parent = writer.set_finalizer(parent, stale, False)
        if deleting:
            return RunResult(key, f"{ctl.parent.kind} {key} is being deleted; removed the "
                                  f"finalizer {stale}, which {ctl.name} no longer handles")
        reads.parent = parent
    if deleting and not (finalizer and finalizer in finalizers):
        return RunResult(key, f"{ctl.parent.kind} {key} is being deleted")
    if deleting and pipeline is not None:
        pipeline.settle()  # a deletion runs alone: after the runs before it, start to end
        pipeline = None
    prior = pipeline.inflight.snapshot() if pipeline is not None else None
    uid = str(parent["metadata"]["uid"])
    try:
        if deleting:
            assert ctl.finalize_fn is not None
            desired = _call(ctl, ctl.finalize_fn, parent, reads, deleting=True)
        else:
            if finalizer and finalizer not in finalizers:
                parent = writer.set_finalizer(parent, finalizer, True)
                reads.parent = parent
                wrote_finalizer = True
                if finalizer not in (parent["metadata"].get("finalizers") or ()):
                    # Deleted before it ever held the finalizer: nothing was made to clean.
                    return RunResult(key, f"{ctl.parent.kind} {key} is being deleted")
            assert ctl.reconcile_fn is not None
            desired = _call(ctl, ctl.reconcile_fn, parent, reads)
        the_plan = plan(ctl, parent, desired, reads, terminating=terminating,
                        unseen=unseen, prune=not deleting)
    except errors.Unavailable:
        raise  # the API server's state, not this parent's: the events say it
    except Exception as exc:
        _report_failure(ctl, parent, exc, writer, seen_conflicts)
        raise
    if pipeline is None:
        outcome = execute(the_plan, writer, parent, submit=submit)
    else:
        outcome = execute(the_plan, writer, parent, submit=submit, inflight=pipeline.inflight,
                          prior=prior, dispatched=pipeline.dispatched)
    result = RunResult(key, desired.summary or outcome.summary(), outcome,
                       desired.requeue_after, retry=outcome.retry,
                       unsettled=bool(outcome.conflicts or outcome.errors),
                       blocked_by=[*(_in_the_way(o) for o in desired.blocked_by),
                                   *the_plan.departing],
                       status_before_writes=bool(outcome.writes) and (
                           isinstance(desired.status, dict)
                           if desired.status_seen_before_writes is None
                           else desired.status_seen_before_writes))
    status = desired.status_for(outcome)
    overtaken = False
    if pipeline is not None:
        parent = pipeline.settle() or parent
        # A later run has started: it writes the status, counting this run's writes too.
        overtaken = pipeline.overtaken()
    if not overtaken and status is not None \
            and status_changed(parent.get("status") or {}, status):
        try:
            parent = writer.patch_status(parent, status)
            result.status_written = True
        except errors.Invalid as exc:
            _parent_refused(ctl, parent, exc, "its status", writer, seen_conflicts)
            raise
        except errors.Conflict:
            # The parent changed since this run read it. Mostly the other router replica,
            # having run the same change, wrote this very status (and posted its Events):
            # nothing left to do. Else (a spec edit, a status this run would put back) the
            # run is repeated on the fresh parent.
            fresh = writer.read_after_conflict(parent, parent["metadata"].get("resourceVersion"))
            if fresh is not None and not status_changed(fresh.get("status") or {}, status):
                parent = fresh
            else:
                result.retry = True
                result.summary += "; status not written: the parent changed meanwhile"
    notes = desired.notes_for(outcome)
    result.notes = notes if result.status_written or (status is None and not overtaken) \
        else [n for n in notes if n.every_run]
    if seen_conflicts is not None:
        seen = seen_conflicts.setdefault(uid, set())
        if ctl.conflict_events:
            result.notes += _new_conflicts(ctl, outcome, seen)
        if ctl.refusal_events:
            result.notes += _new_refusals(outcome, seen)
            _once(seen, "failed: ", {})  # it runs again: a later failure is news again
    for note in result.notes:
        writer.post_event(parent, note)
    if deleting and desired.done and not outcome.errors:
        try:
            writer.set_finalizer(parent, finalizer or "", False)
        except errors.Invalid as exc:
            _parent_refused(ctl, parent, exc, f"the removal of its finalizer {finalizer}",
                            writer, seen_conflicts)
            raise
        result.summary += "; cleanup done, finalizer removed"
        wrote_finalizer = True
    # (a conflict already reported is no news: its Event was posted when it was new, and
    # the watcher's resync would otherwise bring back a line per object for every one)
    result.quiet = not (outcome.writes or outcome.errors or outcome.retry
                        or result.status_written or result.notes or result.retry
                        or wrote_finalizer)
    return result


def _in_the_way(obj: Obj) -> Conflict:
    meta = obj.get("metadata") or {}
    return Conflict(str(obj.get("kind")), meta.get("namespace") or "", str(meta.get("name")),
                    "reported by the handler")


def _call(ctl: Controller, fn: Callable[[Obj, Reads], Desired], parent: Obj,
          reads: Reads, *, deleting: bool = False) -> Desired:
    try:
        desired = fn(parent, reads)
    except SpecError as exc:
        return invalid_spec(ctl, parent, exc, now_rfc3339(), deleting=deleting)
    if not isinstance(desired, Desired):
        raise TypeError(f"handler {ctl.name!r}: {fn.__qualname__} returned "
                        f"{type(desired).__name__}, not Desired")
    return desired


def _new_conflicts(ctl: Controller, outcome: Outcome, seen: set[str]) -> list[Note]:
    """A Warning Event per conflict this process has not reported for this parent yet."""
    return _once(seen, "conflict: ", {
        f"{c.kind} {c}": Note("Warning", "ChildConflict",
                              f"{c.kind} {c} {c.reason}: left unchanged. Delete or rename it "
                              f"to let {ctl.name} create its own.")
        for c in outcome.conflicts})


def _new_refusals(outcome: Outcome, seen: set[str]) -> list[Note]:
    """A Warning Event per write the API server refused that this process has not reported
    for this parent yet (with the API server's reason: an invalid quantity, a quota...)."""
    return _once(seen, "refused: ", {
        str(e): Note("Warning", "WriteRefused", f"the API server refused to {e}: "
                     f"{_what_to_do(e)}; tried again with backoff (at most every "
                     f"{_every(retry_cap([e]) or MAX_BACKOFF)}) "
                     "and whenever something changes")
        for e in outcome.refused})


#: How authorization words a refusal (``User "..." cannot create resource "x"``); any other
#: 403 comes from admission: a quota, a Pod Security level, what a storage class allows.
_RBAC_REFUSAL = re.compile(r'cannot [a-z]+ resource "')


def _what_to_do(error: WriteError) -> str:
    if error.status == 403 and _RBAC_REFUSAL.search(error.message):
        return "grant the router's ServiceAccount what it names"
    if error.status == 403 and "attempting to grant RBAC permissions not currently held" \
            in error.message:
        return ("grant the router's ServiceAccount bind on the role it hands out (README: "
                "Writing your own handler), or the permissions it names")
    if error.status == 403:
        return ("an admission check refused it (a quota, a policy, what the storage class "
                "allows): change the spec, or that policy")
    if error.status == 404:
        return "its namespace does not exist"
    if error.status == 409:
        return "another field manager set those fields: it owns them until it gives them up"
    return ("fix what it names: in the spec, or in the object as edited by hand (server-side "
            "apply merges with it)")


def _report_failure(ctl: Controller, parent: Obj, exc: Exception, writer: Writer,
                    seen_conflicts: dict[str, set[str]] | None) -> None:
    """A Warning Event on the parent when its run fails (the handler raised, a child it may
    not have), once per distinct failure: where the user looks (kubectl describe), not only
    in the router's log. The run is retried with backoff either way."""
    what = f"{type(exc).__name__}: {one_line(str(exc))}"
    _post_failure(ctl, parent, what, Note(
        "Warning", "ReconcileFailed", f"{ctl.name} failed: {what}; retried with backoff "
        "(the router's log has the details)"), writer, seen_conflicts)


def _parent_refused(ctl: Controller, parent: Obj, exc: errors.Invalid, what: str,
                    writer: Writer, seen_conflicts: dict[str, set[str]] | None) -> None:
    """A Warning Event on a parent whose own write the API server refuses as invalid: the
    object as stored no longer passes its CRD's schema, mostly one made stricter since it was
    stored (Kubernetes before 1.30 checks the whole object on every write, the status and
    the finalizers included). Nothing the handler does can mend it, and the log alone would
    leave the user wondering why the status never changes, or why a deletion never ends."""
    _post_failure(ctl, parent, f"refused {what}", Note(
        "Warning", "ParentRefused",
        f"the API server refused {what}: {one_line(exc.message)}; the object as stored does "
        "not pass its CustomResourceDefinition's schema (made stricter since it was "
        "stored?): change what that names in its spec; retried with backoff"),
        writer, seen_conflicts)


def _post_failure(ctl: Controller, parent: Obj, label: str, note: Note, writer: Writer,
                  seen_conflicts: dict[str, set[str]] | None) -> None:
    """Post a failure's ``note`` unless this failure (``label``) was posted since the
    parent's last successful run, or the handler reports failures itself. The failure is
    what propagates: a note that can not be posted is a log line."""
    if not ctl.refusal_events or seen_conflicts is None:
        return
    seen = seen_conflicts.setdefault(str(parent["metadata"]["uid"]), set())
    for fresh in _once(seen, "failed: ", {label: note}):
        try:
            writer.post_event(parent, fresh)
        except Exception as posting:
            log.warning("%s: could not post the failure as an Event: %s", ctl.name, posting)


def _once(seen: set[str], kind: str, current: dict[str, Note]) -> list[Note]:
    """The notes of ``current`` (by label) not reported yet; labels of this ``kind`` that
    are gone are forgotten, so each is reported again if it comes back."""
    labels = {kind + label for label in current}
    notes = [note for label, note in current.items() if kind + label not in seen]
    seen.difference_update({s for s in seen if s.startswith(kind)} - labels)
    seen.update(labels)
    return notes
