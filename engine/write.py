"""Carry out a :class:`~eventop.engine.plan.Plan`: the writes, in parallel, and what they did.

A fan-out (one source copied into 1,000 namespaces) is 1,000 independent writes: they go
through a bounded thread pool, so the run takes about as long as the slowest few writes
instead of their sum, and the API server sees a bounded number of requests at once.

Each write's failure is the child's, not the run's: a refused write (403, 422, a field
conflict) is recorded in the :class:`~eventop.engine.desired.Outcome` and the others go
on. Only an unavailable API server fails the run (after the other writes finished), so
that it is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from eventop.engine.desired import Conflict, Note, Outcome, WriteError
from eventop.engine.plan import Action, Plan, in_sync, is_ours, replacement
from eventop.kube import errors

log = logging.getLogger("eventop.engine")

Obj = dict[str, Any]


class Writer(Protocol):
    """The API calls the engine makes, under one handler's field manager."""

    def create(self, obj: Obj) -> Obj: ...
    def apply(self, obj: Obj, *, force: bool) -> Obj: ...
    def replace(self, obj: Obj) -> Obj: ...
    def delete(self, obj: Obj) -> None: ...
    def read(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None: ...
    def patch_status(self, parent: Obj, status: Obj) -> Obj: ...
    def set_finalizer(self, parent: Obj, finalizer: str, present: bool) -> Obj: ...
    def post_event(self, parent: Obj, note: Note) -> None: ...


class StaleWrite(Exception):
    """A replace lost a race twice (the object keeps changing): the run is retried."""


def execute(plan: Plan, writer: Writer, parent: Obj, *,
            submit: Callable[..., Any] | None = None) -> Outcome:
    """Make every write of ``plan`` for ``parent``; ``submit`` (an Executor's) runs them in
    parallel."""
    if any(a.adopt for a in plan.actions) and not _still_alive(writer, parent):
        plan = Plan([a for a in plan.actions if not a.adopt], plan.unchanged, plan.conflicts,
                    plan.skipped + [a.existing for a in plan.actions
                                    if a.adopt and a.existing is not None])
    parent_uid = str(parent["metadata"]["uid"])
    outcome = Outcome(unchanged=list(plan.unchanged), conflicts=list(plan.conflicts),
                      skipped=list(plan.skipped))
    if submit is not None and len(plan.actions) > 1:
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


def _still_alive(writer: Writer, parent: Obj) -> bool:
    """Re-read the parent from the API server before adopting anything (as Kubernetes'
    ControllerRefManager does): a cache may not show yet that it is being deleted, and an
    object adopted by a parent on its way out would be garbage-collected with it."""
    meta = parent["metadata"]
    fresh = writer.read(parent["apiVersion"], parent["kind"], meta["name"], meta.get("namespace"))
    return bool(fresh and fresh["metadata"].get("uid") == meta.get("uid")
                and not fresh["metadata"].get("deletionTimestamp"))


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
    return category, value


def _write(action: Action, writer: Writer, parent_uid: str) -> tuple[str, Any]:
    try:
        if action.verb == "delete":
            assert action.existing is not None
            writer.delete(action.existing)
            return "deleted", action.existing
        if action.verb == "create":
            return _create(action, writer, parent_uid)
        if action.verb == "recreate":
            assert action.existing is not None and action.desired is not None
            writer.delete(action.existing)
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


def _create(action: Action, writer: Writer, parent_uid: str,
            category: str = "created") -> tuple[str, Any]:
    """POST; if the name is taken, it is ours to update (another replica made it) or a
    conflict, never merged into."""
    assert action.desired is not None and action.child is not None
    try:
        return category, writer.create(action.desired)
    except errors.NotFound:
        return "skipped", action.desired  # the namespace went away meanwhile
    except errors.Conflict:
        pass
    meta = action.desired["metadata"]
    current = writer.read(action.desired["apiVersion"], action.kind, meta["name"],
                          meta.get("namespace"))
    if current is None:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} existed at create "
                         "and was gone right after")
    if not is_ours(current, parent_uid):
        return "conflicts", Conflict(action.kind, action.namespace, action.name,
                                     "created by someone else meanwhile")
    if action.child.mode == "create" or in_sync(action.child, current, action.desired):
        return "unchanged", current
    return "updated", _update(action, writer, current)


def _update(action: Action, writer: Writer, existing: Obj | None) -> Obj:
    assert action.desired is not None and action.child is not None and existing is not None
    if action.child.mode != "replace":
        return writer.apply(action.desired, force=action.child.force)
    try:
        return writer.replace(replacement(existing, action.desired))
    except errors.Conflict:
        pass  # changed since the cache saw it: once more from a fresh read
    meta = action.desired["metadata"]
    fresh = writer.read(action.desired["apiVersion"], action.kind, meta["name"],
                        meta.get("namespace"))
    if fresh is None:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} went away")
    if in_sync(action.child, fresh, action.desired):
        return fresh
    try:
        return writer.replace(replacement(fresh, action.desired))
    except errors.Conflict as exc:
        raise StaleWrite(f"{action.kind} {action.namespace}/{action.name} keeps changing: "
                         f"{exc}") from exc


def _terminating(exc: errors.KubeError) -> bool:
    return "terminat" in str(exc).lower()


def _error(action: Action, exc: BaseException, status: int) -> WriteError:
    message = getattr(exc, "message", None) or str(exc)
    return WriteError(action.verb, action.kind, action.namespace, action.name,
                      message.strip().splitlines()[0] if message.strip() else message, status,
                      str(getattr(exc, "reason", "") or ""))
