"""What a handler returns (:class:`Desired`) and what the engine tells it back (:class:`Outcome`).

A handler's reconcile function is pure: from the parent object and its cached reads it
says which children should exist, what the parent's status should be and which Kubernetes
Events are worth posting. It does no I/O; the engine compares, writes the differences and
hands the status and Events functions an :class:`Outcome` of what the writes did, so that
status can count what is really in place (copies written, conflicts, refused writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Obj = dict[str, Any]
Mode = Literal["apply", "replace", "create"]


@dataclass
class Child:
    """One object the parent wants, and how the engine writes it.

    ``obj`` carries apiVersion, kind, metadata.name (and metadata.namespace for namespaced
    kinds). A missing child is always created with POST, which fails if someone made an
    object of that name meanwhile: it is then a conflict, never merged into. An existing child
    that differs is written by ``mode``:

    * ``"apply"`` (default): server-side apply under the handler's field manager. Fields other
      managers set are left to them; ``force=True`` takes back fields another manager changed
      (right for content the handler alone decides, like a copy's data);
    * ``"replace"``: PUT the whole object (resourceVersion precondition) with exactly the
      desired top-level fields, other managers' labels, annotations and owners kept. For
      exact content: a key added by hand to a copy's data is removed;
    * ``"create"``: created once, never updated (a Job, a generated password).

    ``recreate=True``: an existing child that differs is deleted and created again (immutable
    fields). ``owned=False``: no ownerReference; the child outlives the parent (a final
    backup, a snapshot) and is never pruned; the engine recognises it as this parent's by the
    label ``eventop.dev/parent-uid``. ``matches(existing, desired)`` decides whether the
    existing object is already as desired (default: every field of ``desired`` has that value
    in ``existing``; for ``"replace"``, the top-level fields are equal). ``reason`` ends the
    log line of each write of it ("created Secret team-a/regcred from default/regcred"):
    names only, never contents.
    """

    obj: Obj
    mode: Mode = "apply"
    force: bool = False
    owned: bool = True
    recreate: bool = False
    matches: Callable[[Obj, Obj], bool] | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.mode not in ("apply", "replace", "create"):
            raise ValueError(f"Child mode must be apply, replace or create, not {self.mode!r}")
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        if not (isinstance(meta, dict) and meta.get("name") and self.obj.get("apiVersion")
                and self.obj.get("kind")):
            raise ValueError("a child needs apiVersion, kind and metadata.name, got "
                             f"{_describe(self.obj)}")


@dataclass(frozen=True)
class Note:
    """A Kubernetes Event to post about the parent: ``type`` is Normal or Warning.

    Posted only by a run that changed the status, unless ``every_run``: then by every run
    that returns it, for a failure that recurs at each scheduled attempt while the status
    stays the same (a provider down at every refresh); the API server counts the repeats on
    the one Event (``count``, ``lastTimestamp``), as it does for the kubelet's BackOff.
    """

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    every_run: bool = False


@dataclass(frozen=True)
class Conflict:
    """An object at a desired child's name that this parent does not own: left untouched."""

    kind: str
    namespace: str
    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class WriteError:
    """A write the API server refused (403, 422, a field conflict...): reported, and the run
    tried again with backoff (0.5 s doubling, at most every 5 minutes) or when something
    changes."""

    verb: str
    kind: str
    namespace: str
    name: str
    message: str
    status: int = 0
    #: The API server's reason (``Invalid``, ``Forbidden``...), when it gave one.
    reason: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.kind} {where}: {self.message}"


@dataclass
class Outcome:
    """What applying a :class:`Desired` did; given to its ``status`` and ``events`` functions.

    ``in_place`` are the desired children now as desired (created, updated or already so),
    as the API server last returned them or the cache holds them.
    """

    created: list[Obj] = field(default_factory=list)
    updated: list[Obj] = field(default_factory=list)
    unchanged: list[Obj] = field(default_factory=list)
    deleted: list[Obj] = field(default_factory=list)
    #: Deletes that found their object gone already (another replica's delete came first).
    gone: list[Obj] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    errors: list[WriteError] = field(default_factory=list)
    #: Desired children not written because their namespace is terminating or the object
    #: is being deleted (it is created again once it is gone).
    skipped: list[Obj] = field(default_factory=list)
    #: A write lost a race with another writer: the run is repeated shortly.
    retry: bool = False

    @property
    def in_place(self) -> list[Obj]:
        return [*self.created, *self.updated, *self.unchanged]

    @property
    def refused(self) -> list[WriteError]:
        """The writes the API server refused: ``errors`` without the lost races (a write
        that found its object changed by another writer, repeated on a fresh view: it mends
        itself and is nothing to report)."""
        return [e for e in self.errors if e.reason != "StaleWrite"]

    def after(self, earlier: Outcome) -> Outcome:
        """This outcome with an ``earlier`` one of the same run (written before it) first."""
        for f in fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, list):
                mine[:0] = getattr(earlier, f.name)
        self.retry = self.retry or earlier.retry
        return self

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted)

    def summary(self) -> str:
        text = (f"{len(self.created)} created, {len(self.updated)} updated, "
                f"{len(self.deleted)} deleted, {len(self.unchanged)} unchanged")
        if self.conflicts:
            text += f", {len(self.conflicts)} conflicts"
        if self.errors:
            text += f", {len(self.errors)} errors"
        return text


StatusFn = Callable[[Outcome], "Obj | None"]
NotesFn = Callable[[Outcome], Iterable[Note]]


@dataclass
class Desired:
    """What a reconcile (or finalize) function returns.

    * ``children``: every object the parent wants (:class:`Child`, or a plain dict for a
      default ``Child``). Owned children not listed are deleted (``prune=False`` keeps them);
    * ``status``: the parent's status, or a function of the :class:`Outcome` returning it;
      merge-patched only when it differs from the status the parent has;
    * ``events``: Kubernetes Events (:class:`Note`), or a function of the Outcome returning
      them; posted only by a run that changed the status (so a stuck state does not post an
      Event per event), or every time when ``status`` is None or the Note says ``every_run``;
    * ``delete``: objects to delete (uid precondition), owned or labelled as this parent's;
    * ``patch``: fields to set in objects this parent neither owns nor made (a
      PersistentVolume's reclaim policy): each a partial object (apiVersion, kind,
      metadata.name, the fields), merge-patched under the handler's field manager with a
      resourceVersion precondition, and only when the cached object does not hold them yet.
      A missing object is not created. Its kind must be among the controller's ``reads``;
    * ``blocked_by``: objects at the children's names that are not this parent's, which
      the function found and reported itself (writing nothing meanwhile): the parent runs
      again when one of them changes or goes, as for the conflicts the engine finds. An
      unowned object maps to no parent, so without this, deleting it (what the report
      asks for) would start no run;
    * ``requeue_after``: run again after this many seconds even if nothing changes (waiting
      for a Job, a periodic check); failures are retried with backoff anyway;
    * ``done`` (finalize only): True once cleanup is complete; the engine then removes the
      finalizer and the API server deletes the parent;
    * ``summary``: the run's line in the log (default: the Outcome's counts);
    * ``status_seen_before_writes``: the status describes the children as they were before
      this run's writes (by default: when it is a value, not a function), so a run that
      wrote is followed by one that sees what it wrote (its own echoes start none).
    """

    children: Iterable[Child | Obj] = ()
    status: Obj | StatusFn | None = None
    events: Iterable[Note] | NotesFn = ()
    delete: Iterable[Obj] = ()
    patch: Iterable[Obj] = ()
    blocked_by: Iterable[Obj] = ()
    requeue_after: float | None = None
    prune: bool = True
    done: bool = True
    summary: str | None = None
    status_seen_before_writes: bool | None = None

    def child_list(self) -> list[Child]:
        return [c if isinstance(c, Child) else Child(c) for c in self.children]

    def status_for(self, outcome: Outcome) -> Obj | None:
        return self.status(outcome) if callable(self.status) else self.status

    def notes_for(self, outcome: Outcome) -> list[Note]:
        return list(self.events(outcome) if callable(self.events) else self.events)


def _describe(obj: Any) -> str:
    if not isinstance(obj, dict):
        return type(obj).__name__
    meta = obj.get("metadata") or {}
    return (f"apiVersion={obj.get('apiVersion')!r} kind={obj.get('kind')!r} "
            f"name={meta.get('name') if isinstance(meta, dict) else None!r}")
