"""A custom resource that asks for something invalid: one model for every handler, reported
one way.

A parent can ask for what no controller can do: an upstream URL with a path, the rate of a
currency against itself, a rule type that does not exist. That is not a failure to retry:
the same spec fails the same way until a person changes it. A handler says so by raising
:class:`SpecError` from its function, as deep in its spec parsing as it finds out; the
engine then, for every handler alike:

* writes and deletes no child: what the parent had stays as it was (an edit that breaks the
  spec must not tear down a mirror that serves pulls);
* sets the parent's status: ``observedGeneration``, the ``Ready`` condition False with the
  error's reason (``InvalidSpec`` unless the handler names a finer one, such as
  ``InvalidUpstream``) and message and, when the controller declares a
  ``degraded_condition``, that condition True with the same reason and message;
* posts a Warning Event with that reason and message when the status changed, so once per
  new error, not once per event;
* counts the run as done: redelivering the event can not fix a spec.

The API server's schema validation catches most of this before a handler sees it; what is
left is what a schema can not say (two fields that must differ, a URL that must have no
path) and objects stored under an older, laxer schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventop.engine.desired import Desired, Note
from eventop.kube.objects import set_condition

if TYPE_CHECKING:
    from eventop.engine.controller import Controller

Obj = dict[str, Any]

READY = "Ready"
INVALID_SPEC = "InvalidSpec"


class SpecError(ValueError):
    """The custom resource asks for something invalid; ``message`` says what and what is
    accepted (it is shown to the user as it is), ``reason`` is the condition and Event
    reason (CamelCase)."""

    def __init__(self, message: str, *, reason: str = INVALID_SPEC) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def invalid_spec(ctl: Controller, parent: Obj, error: SpecError, now: str, *,
                 deleting: bool = False) -> Desired:
    """What the engine does for a parent whose function raised ``error``: no child written
    or deleted, the status and Warning Event of the module docstring. A parent being
    deleted keeps its finalizer until its spec is fixed (its cleanup could not run)."""
    meta = parent.get("metadata") or {}
    generation = meta.get("generation")
    conditions = (parent.get("status") or {}).get("conditions")
    conditions = set_condition(conditions, READY, False, error.reason, error.message, now,
                               generation)
    if ctl.degraded_condition:
        conditions = set_condition(conditions, ctl.degraded_condition, True, error.reason,
                                   error.message, now, generation)
    status: Obj = {"conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return Desired(status=status, events=[Note("Warning", error.reason, error.message)],
                   prune=False, done=not deleting,
                   summary=f"{parent.get('kind')} {_name(meta)}: {error.reason}: "
                           f"{error.message}")


def _name(meta: Obj) -> str:
    return f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") \
        else str(meta.get("name"))
