"""Declaring a desired-state handler: its parent kind, what it owns and reads, how other
kinds' changes map to parents, and its pure reconcile (and finalize) function.

::

    from eventop.engine import Controller, Desired
    from eventop.handlers import Registry

    registry = Registry()
    labels = Controller("team-labels", parent="eventop.dev/v1/Team",
                        owns=["v1/ConfigMap"], reads=["v1/Namespace"], registry=registry)

    @labels.reconcile
    def desired(team, reads):
        ...
        return Desired(children=[...], status={...})

    @labels.maps("v1/Namespace")
    def teams_of_namespace(namespace, reads):
        return [t for t in reads.list("eventop.dev/v1/Team") if ...]

The declaration is all the rest of eventop needs to know: the router caches the declared
kinds (list+watch, so reads cost no request), the watcher watches the kinds whose changes
map to parents, and RBAC is derived from it (``tests/install``). See ``docs/ENGINE.md``.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from eventop.engine.desired import Desired
from eventop.engine.kinds import Key, Kind, merge_kinds
from eventop.kube.store import controller_ref

if TYPE_CHECKING:
    from eventop.engine.reads import Reads
    from eventop.handlers.events import Event
    from eventop.handlers.registry import Registry

Obj = dict[str, Any]
KindSpec = str | Kind | tuple[str, str]
ReconcileFn = Callable[[Obj, "Reads"], Desired]
AdoptFn = Callable[[Obj, Obj], bool]
MapResult = Iterable["Key | Obj | tuple[str, str] | str"]
MapFn = Callable[[Obj, "Reads"], MapResult]
TriggerFn = Callable[["Event", "Reads"], MapResult]

FINALIZER_DOMAIN = "eventop.dev"
#: Marks a child that is not owned (``Child(owned=False)``: it outlives its parent) as the
#: child of the parent of this uid.
PARENT_UID_LABEL = "eventop.dev/parent-uid"
#: Names the controller that wrote a child, where two controllers of one parent kind own the
#: same child kind: each prunes only its own, instead of each other's in a loop.
CONTROLLER_ANNOTATION = "eventop.dev/controller"
#: On each child written by server-side apply: a hash of the body last applied. A field the
#: handler no longer wants is still "contained" in the live object, so only this tells that
#: the apply that removes it is due (kubectl keeps the whole body in an annotation for it).
APPLIED_ANNOTATION = "eventop.dev/applied-hash"
#: On a child the engine created (POST) and has not applied since: the POST's fields belong
#: to an Update entry, which no apply removes from, so the first apply hands them over to
#: the apply entry first (``KubeWriter.apply``); that apply, not naming it, removes this.
CREATED_ANNOTATION = "eventop.dev/created-not-applied"


class Controller:
    """One desired-state handler. ``name`` is unique per router and names its field manager
    (``eventop-<name>``) and default finalizer (``eventop.dev/<name>``).

    * ``parent``: the kind whose objects are reconciled, one run per object (its key);
    * ``owns``: kinds of the children it creates; a change of a child (its controller
      ownerReference names the parent) maps to that parent without further declaration;
    * ``reads``: further kinds the function reads from the cache (``reads.get``/``list``);
      reading a kind not declared anywhere is an error that names it;
    * ``registry``: where to register it (else call ``registry.add(controller)``);
    * ``conflict_events``: post a Warning Event when a desired child's name is taken by an
      object this parent does not own (``ChildConflict``); False when the handler reports
      conflicts in its own words;
    * ``refusal_events``: post a Warning Event when the API server refuses a write (with its
      reason: a quota, an immutable field, RBAC) and when a run fails (``ReconcileFailed``);
      by default as ``conflict_events``, False when the handler reports these itself;
    * ``degraded_condition``: the type of a condition the parent's status holds True while
      something is wrong (``"Degraded"``); an invalid spec (:class:`SpecError`) sets it True
      with the same reason and message as ``Ready=False``;
    * ``overlap``: the next run of a parent may start once this one's writes are sent,
      before they are answered (one slow write then holds back no other child; see
      docs/ENGINE.md section 6). Only for a function that reads nothing but the cache and
      its parent: the next run does not see the writes still in flight (they are not sent
      twice), so a function that calls out (a provider) would call again.
    """

    def __init__(self, name: str | None = None, *, parent: KindSpec,
                 owns: Iterable[KindSpec] = (), reads: Iterable[KindSpec] = (),
                 field_manager: str | None = None, finalizer: str | None = None,
                 registry: Registry | None = None, conflict_events: bool = True,
                 refusal_events: bool | None = None,
                 degraded_condition: str | None = None, overlap: bool = False,
                 module: str | None = None) -> None:
        from eventop.handlers.registry import field_manager_for

        self.module = module or _caller_module()
        self.name = name or self.module.removeprefix("eventop.handlers.").replace("_", "-")
        self.parent = Kind.of(parent)
        self.owns = [Kind.of(k) for k in owns]
        self.reads = [Kind.of(k) for k in reads]
        self.field_manager = field_manager or field_manager_for(self.module, self.name)
        self._finalizer = finalizer
        self.conflict_events = conflict_events
        self.refusal_events = conflict_events if refusal_events is None else refusal_events
        self.degraded_condition = degraded_condition
        self.overlap = overlap
        self.reconcile_fn: ReconcileFn | None = None
        self.finalize_fn: ReconcileFn | None = None
        self.adopt_fn: AdoptFn | None = None
        #: Owned kinds another controller of the same parent kind owns too (see
        #: :func:`share_children`): children of these carry CONTROLLER_ANNOTATION.
        self.shared: set[tuple[str, str]] = set()
        self.mappers: dict[tuple[str, str], tuple[Kind, MapFn]] = {}
        self.triggers_by_type: dict[str, TriggerFn] = {}
        self._kinds: tuple[list[Kind], list[Kind]] | None = None  # (kinds, event kinds)
        if registry is not None:
            registry.add(self)

    def __repr__(self) -> str:
        return f"Controller({self.name!r}, parent={str(self.parent)!r})"

    # -- decorators ------------------------------------------------------------------

    def reconcile(self, fn: ReconcileFn) -> ReconcileFn:
        """``fn(parent, reads) -> Desired``: what should exist for a live parent."""
        self.reconcile_fn = fn
        return fn

    def finalize(self, fn: ReconcileFn) -> ReconcileFn:
        """``fn(parent, reads) -> Desired(done=...)``: cleanup of a parent being deleted.

        Declaring it makes the engine keep a finalizer on every live parent, so the API
        server waits for ``done=True`` before the parent (and, through garbage collection,
        its owned children) goes.
        """
        self.finalize_fn = fn
        return fn

    def adopts(self, fn: AdoptFn) -> AdoptFn:
        """``fn(parent, existing) -> bool``: may an object at a desired child's name that this
        parent does not own be taken over (its ownerReference added)? Default: never."""
        self.adopt_fn = fn
        return fn

    def maps(self, kind: KindSpec, **options: Any) -> Callable[[MapFn], MapFn]:
        """``fn(obj, reads) -> parents``: which parents a change of ``obj`` concerns.

        Return parent objects, :class:`Key` s, ``(namespace, name)`` pairs or names. ``obj``
        is the object as the cache holds it after the change (its last state if deleted).
        ``options`` are :class:`Kind`'s (``metadata_only``, ``selector``).
        """
        declared = Kind.of(kind, **options)

        def register(fn: MapFn) -> MapFn:
            self.mappers[declared.key] = (declared, fn)
            self._kinds = None
            return fn
        return register

    def triggers(self, *types: str) -> Callable[[TriggerFn], TriggerFn]:
        """``fn(event, reads) -> parents`` for CloudEvents that are not Kubernetes changes
        (shell-style type patterns): a scheduled refresh that concerns every parent, say."""
        if not types:
            raise TypeError("triggers() needs at least one event type pattern")

        def register(fn: TriggerFn) -> TriggerFn:
            for pattern in types:
                self.triggers_by_type[pattern] = fn
            return fn
        return register

    # -- what it needs ---------------------------------------------------------------

    @property
    def finalizer(self) -> str | None:
        if self._finalizer:
            return self._finalizer
        return f"{FINALIZER_DOMAIN}/{self.name}" if self.finalize_fn else None

    def kinds(self) -> list[Kind]:
        """Every kind it reads, one entry per kind (merged): what the router caches."""
        return self._declared()[0]

    def event_kinds(self) -> list[Kind]:
        """The kinds whose changes can start a run: parent, owned kinds and mapped kinds."""
        return self._declared()[1]

    def _declared(self) -> tuple[list[Kind], list[Kind]]:
        if self._kinds is None:  # asked for every event: worked out once
            mapped = [k for k, _ in self.mappers.values()]
            self._kinds = (
                list(merge_kinds([self.parent, *self.owns, *self.reads, *mapped]).values()),
                list(merge_kinds([self.parent, *self.owns, *mapped]).values()))
        return self._kinds

    def declares(self, api_version: str, kind: str) -> bool:
        return any(k.key == (api_version, kind) for k in self.kinds())

    def check(self) -> None:
        """Raise ValueError if the declaration can not run (no reconcile function)."""
        if self.reconcile_fn is None:
            raise ValueError(f"controller {self.name!r} ({self.module}) has no reconcile "
                             "function: decorate one with @controller.reconcile")

    # -- mapping a change to parents ---------------------------------------------------

    def keys_for(self, obj: Obj, reads: Reads, *, parent_namespaced: bool,
                 former_owner: Obj | None = None) -> set[Key]:
        """The parents a change of ``obj`` concerns (may be none). ``former_owner``: the
        controller ownerReference the change removed (someone took the child over): that
        parent is concerned too, as controller-runtime maps the old object's owner."""
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        keys: set[Key] = set()
        if (api_version, kind) == self.parent.key:
            keys.add(Key.of(obj))
        if any(k.key == (api_version, kind) for k in self.owns):
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace") or ""
            for owner in (controller_ref(obj), former_owner):
                if (owner is not None and owner.get("apiVersion") == self.parent.api_version
                        and owner.get("kind") == self.parent.kind):
                    keys.add(Key(ns if parent_namespaced else "", str(owner.get("name"))))
            uid = (meta.get("labels") or {}).get(PARENT_UID_LABEL)
            if uid:  # a child that outlives its parent (no ownerReference): its label
                keys.update(Key.of(p) for p in reads.list(
                    self.parent, ns if parent_namespaced and ns else None)
                    if (p.get("metadata") or {}).get("uid") == uid)
        mapper = self.mappers.get((str(api_version), str(kind)))
        if mapper is not None:
            keys.update(_to_key(item) for item in mapper[1](obj, reads) or ())
        return keys


    def keys_for_event(self, event: Event, reads: Reads) -> set[Key] | None:
        """Parents of a non-Kubernetes event, or None if no trigger wants its type."""
        wanted = [fn for pattern, fn in self.triggers_by_type.items()
                  if fnmatch.fnmatchcase(event.type, pattern)]
        if not wanted:
            return None
        keys: set[Key] = set()
        for fn in dict.fromkeys(wanted):
            keys.update(_to_key(item) for item in fn(event, reads) or ())
        return keys


def share_children(controllers: Iterable[Controller]) -> None:
    """Mark the owned kinds that two controllers of one parent kind both own (a Tenant's
    RoleBindings written by two handlers): every child of one parent has that parent's
    ownerReference, so only an annotation tells whose it is, to prune and to update."""
    by_parent: dict[tuple[str, str], list[Controller]] = {}
    for ctl in controllers:
        by_parent.setdefault(ctl.parent.key, []).append(ctl)
    for group in by_parent.values():
        for ctl in group:
            for other in group:
                if other is not ctl:
                    ctl.shared |= {k.key for k in ctl.owns} & {k.key for k in other.owns}


def _to_key(item: Any) -> Key:
    if isinstance(item, Key):
        return item
    if isinstance(item, dict):
        return Key.of(item)
    if isinstance(item, tuple) and len(item) == 2:
        return Key(item[0] or "", str(item[1]))
    if isinstance(item, str):
        return Key("", item)
    raise TypeError(f"a mapping function must return parents (objects, Keys, (namespace, name) "
                    f"pairs or names), not {type(item).__name__}")


def _caller_module() -> str:
    """The module that declared the controller (two frames up: past ``__init__``)."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None
        return str(caller.f_globals.get("__name__", "handlers")) if caller else "handlers"
    finally:
        del frame
