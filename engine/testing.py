"""Test a controller without any server: an in-memory world of objects that answers the
engine's reads and writes the way the API server would (uids, resourceVersions, 409 on a
taken name, resourceVersion preconditions, finalizers, garbage collection of owned
children), running the same planning and writing code as the router::

    from eventop.engine.testing import World

    def test_a_team_gets_its_configmap():
        world = World([team("a"), namespace("team-a")])
        world.converge(labels)                      # runs until nothing changes
        assert world.get("v1/ConfigMap", "team", "team-a")["data"] == {...}
        assert world.writes == [("create", "ConfigMap", "team-a", "team")]

Server-side apply is approximated by merging the applied fields into the object (no field
ownership between managers); everything else behaves as on a real API server.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from eventop.engine.controller import Controller
from eventop.engine.desired import Note
from eventop.engine.kinds import Key, Kind
from eventop.engine.reads import Reads
from eventop.engine.run import RunResult, run
from eventop.kube import errors, is_terminating, now_rfc3339
from eventop.kube.resources import ResourceTable
from eventop.kube.store import Store

if TYPE_CHECKING:
    from eventop.handlers.events import Event

Obj = dict[str, Any]
KindSpec = str | Kind | tuple[str, str]

_BUILTIN = ResourceTable()  # the scope of Kubernetes' own kinds


class World:
    """Objects by kind, plus the log of what the engine wrote and posted."""

    def __init__(self, objects: Iterable[Obj] = (), *,
                 unserved: Iterable[KindSpec] = ()) -> None:
        self._stores: dict[tuple[str, str], Store] = {}
        #: Kinds this world's API server does not serve (an add-on's CRD not installed).
        self.unserved = {Kind.of(k).key for k in unserved}
        self._rv = itertools.count(1)
        #: Every write the engine made: (verb, kind, namespace, name).
        self.writes: list[tuple[str, str, str, str]] = []
        #: The body last applied to each child: server-side apply removes what a manager
        #: applied before and no longer names (maps key by key; the rest is merged).
        self.applied: dict[tuple[str, str, str, str], Obj] = {}
        #: Every Kubernetes Event posted: (parent name, Note).
        self.events: list[tuple[str, Note]] = []
        self._seen_conflicts: dict[str, set[str]] = {}
        for obj in objects:
            self.put(obj)

    # -- the outside world -------------------------------------------------------------

    def put(self, obj: Obj) -> Obj:
        """Create or change an object as a user would (uid, resourceVersion and generation
        filled in: a change of anything but metadata and status is a new generation)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        current = self.get((obj["apiVersion"], obj["kind"]), meta["name"], meta.get("namespace"))
        meta.setdefault("uid", current["metadata"]["uid"] if current else str(uuid.uuid4()))
        if "generation" not in meta:  # as the API server: one more for each spec change
            before = int(current["metadata"].get("generation") or 1) if current else 1
            meta["generation"] = before + (current is not None
                                           and _spec_of(current) != _spec_of(obj))
        meta.setdefault("creationTimestamp", now_rfc3339())
        return self._store_obj(obj)

    def delete(self, kind: KindSpec, name: str, namespace: str | None = None) -> None:
        """Delete as the API server does: with finalizers, only mark it; owned children go
        with their owner (garbage collection)."""
        current = self.get(kind, name, namespace)
        if current is None:
            return
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now_rfc3339()
                self._store_obj(marked)
            return
        self._store(current["apiVersion"], current["kind"]).forget_deleted(current)
        uid = current["metadata"]["uid"]
        for store in list(self._stores.values()):
            for child in store.list(owner=uid):
                self.delete((child["apiVersion"], child["kind"]), child["metadata"]["name"],
                            child["metadata"].get("namespace"))

    # -- reading -----------------------------------------------------------------------

    def get(self, kind: KindSpec, name: str, namespace: str | None = None) -> Obj | None:
        k = Kind.of(kind)
        store = self._stores.get(k.key)
        return store.get(namespace, name) if store else None

    def list(self, kind: KindSpec, namespace: str | None = None, **filters: Any) -> list[Obj]:
        k = Kind.of(kind)
        store = self._stores.get(k.key)
        return store.list(namespace, **filters) if store else []

    # -- running a controller ----------------------------------------------------------

    def reconcile(self, ctl: Controller, name: str, namespace: str | None = None) -> RunResult:
        """One run for one parent, exactly as the router would make it."""
        ctl.check()
        key = Key(namespace or "", name)
        parent = self.get(ctl.parent, name, namespace)
        reads = Reads(self._lookup, ctl.kinds(), ctl.name, parent)
        return run(ctl, key, parent, reads, _WorldWriter(self, ctl.field_manager),
                   terminating=self._terminating, unseen=lambda ns: self._unseen(ctl, ns),
                   seen_conflicts=self._seen_conflicts)

    def changed(self, ctl: Controller, obj: Obj) -> list[RunResult]:
        """Hand ``ctl`` a change of ``obj`` as the router does: mapped to the parents it
        concerns (the object itself if it is a parent, the controller owner of an owned
        child, the ``@maps`` functions), each reconciled once. ``obj`` is its state after the
        change (its last state if it was deleted: delete it from the world first)."""
        reads = Reads(self._lookup, ctl.kinds(), ctl.name)
        parents = self.list(ctl.parent)
        namespaced = not parents or bool(parents[0]["metadata"].get("namespace"))
        keys = ctl.keys_for(obj, reads, parent_namespaced=namespaced)
        return [self.reconcile(ctl, k.name, k.namespace or None) for k in sorted(keys)]

    def triggered(self, ctl: Controller, event: Event) -> list[RunResult]:
        """Hand ``ctl`` a CloudEvent that is not a Kubernetes change (a scheduled refresh):
        its ``@triggers`` function names the parents, each reconciled once."""
        reads = Reads(self._lookup, ctl.kinds(), ctl.name)
        keys = ctl.keys_for_event(event, reads) or set()
        return [self.reconcile(ctl, k.name, k.namespace or None) for k in sorted(keys)]

    def converge(self, ctl: Controller, max_rounds: int = 10) -> list[RunResult]:
        """Run every parent until a round writes nothing; fails if it never settles (two
        writes fighting each other, a status that changes on every run)."""
        results: list[RunResult] = []
        for _ in range(max_rounds):
            before = len(self.writes)
            for parent in self.list(ctl.parent):
                meta = parent["metadata"]
                results.append(self.reconcile(ctl, meta["name"], meta.get("namespace")))
            if len(self.writes) == before:
                return results
        raise AssertionError(f"{ctl.name} did not converge in {max_rounds} rounds; last "
                             f"writes: {self.writes[-10:]}")

    # -- internals -----------------------------------------------------------------------

    def _lookup(self, api_version: str, kind: str) -> Store | None:
        if (api_version, kind) in self.unserved:
            return None
        return self._store(api_version, kind)

    def _store(self, api_version: str, kind: str) -> Store:
        store = self._stores.get((api_version, kind))
        if store is None:
            # A built-in kind's scope is known; another's is learnt from its first object
            # (a namespaced parent put with its namespace, a cluster-scoped one without).
            known = _BUILTIN.by_kind(api_version, kind)
            store = self._stores[(api_version, kind)] = Store(
                api_version, kind, namespaced=known.namespaced if known else None)
        return store

    def _store_obj(self, obj: Obj) -> Obj:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        store = self._store(obj["apiVersion"], obj["kind"])
        if store.namespaced is None:
            store.namespaced = bool(obj["metadata"].get("namespace"))
        store.put(obj)
        return copy.deepcopy(obj)

    def _terminating(self, namespace: str) -> bool:
        return is_terminating(self.get("v1/Namespace", namespace))

    def _unseen(self, ctl: Controller, namespace: str) -> bool:
        """As the router's: the controller reads every Namespace (declared, no selector)
        and the world does not hold this one."""
        if not any(k.key == ("v1", "Namespace") and not k.selector for k in ctl.kinds()):
            return False
        return self.get("v1/Namespace", namespace) is None


class _WorldWriter:
    """The engine's :class:`~eventop.engine.write.Writer` over a :class:`World`."""

    def __init__(self, world: World, manager: str) -> None:
        self.world = world
        self.manager = manager

    def _log(self, verb: str, obj: Obj) -> None:
        meta = obj["metadata"]
        self.world.writes.append((verb, obj["kind"], meta.get("namespace") or "", meta["name"]))

    def _current(self, obj: Obj) -> Obj | None:
        meta = obj["metadata"]
        return self.world.get((obj["apiVersion"], obj["kind"]), meta["name"],
                              meta.get("namespace"))

    def create(self, obj: Obj) -> Obj:
        if self._current(obj) is not None:
            raise errors.Conflict(f"{obj['kind']} {obj['metadata']['name']} already exists",
                                  reason="AlreadyExists")
        ns = obj["metadata"].get("namespace")
        if ns and self.world._terminating(ns):
            raise errors.Forbidden(f"namespace {ns} is being terminated", reason="Forbidden")
        self._log("create", obj)
        # what it wrote is handed to its applies before the first (KubeWriter.apply)
        self.world.applied[_slot_of(obj)] = copy.deepcopy(obj)
        body = copy.deepcopy(obj)
        body["metadata"].pop("resourceVersion", None)
        body["metadata"]["uid"] = str(uuid.uuid4())
        return self.world.put(body)

    def apply(self, obj: Obj, *, force: bool, existing: Obj | None = None) -> Obj:
        current = self._current(obj)
        self._log("apply", obj)
        slot = _slot_of(obj)
        before = self.world.applied.get(slot)
        self.world.applied[slot] = copy.deepcopy(obj)
        if current is None:
            return self.world.put(obj)
        base = copy.deepcopy(current)
        if before is not None:
            _drop_unnamed(base, before, obj)
        return self.world._store_obj(_merge(base, copy.deepcopy(obj)))

    def replace(self, obj: Obj) -> Obj:
        current = self._current(obj)
        if current is None:
            raise errors.NotFound(f"{obj['kind']} {obj['metadata']['name']} not found")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise errors.Conflict("the object has been modified", reason="Conflict")
        self._log("replace", obj)
        return self.world._store_obj(copy.deepcopy(obj))

    def delete(self, obj: Obj) -> bool:
        current = self._current(obj)
        if current is None or current["metadata"]["uid"] != obj["metadata"]["uid"]:
            return False
        rv = obj["metadata"].get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise errors.Conflict("the object has been modified", reason="Conflict")
        self._log("delete", obj)
        meta = obj["metadata"]
        self.world.delete((obj["apiVersion"], obj["kind"]), meta["name"], meta.get("namespace"))
        return True

    def patch(self, obj: Obj, resource_version: str) -> Obj:
        current = self._current(obj)
        if current is None:
            raise errors.NotFound(f"{obj['kind']} {obj['metadata']['name']} not found")
        if resource_version != current["metadata"]["resourceVersion"]:
            raise errors.Conflict("the object has been modified", reason="Conflict")
        self._log("patch", obj)
        fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        meta = {k: v for k, v in obj["metadata"].items() if k in ("labels", "annotations")}
        return self.world._store_obj(_merge(copy.deepcopy(current),
                                            copy.deepcopy({**fields, "metadata": meta})))

    def read(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None:
        found = self.world.get((api_version, kind), name, namespace)
        return copy.deepcopy(found) if found else None

    def read_after_conflict(self, obj: Obj, tried: str | None) -> Obj | None:
        meta = obj["metadata"]
        return self.read(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def patch_status(self, parent: Obj, status: Obj) -> Obj:
        current = self._current(parent)
        if current is None:
            return parent
        self._log("status", parent)
        body = copy.deepcopy(current)
        body["status"] = {**(body.get("status") or {}), **copy.deepcopy(status)}
        return self.world._store_obj(body)

    def set_finalizer(self, parent: Obj, finalizer: str, present: bool) -> Obj:
        current = self._current(parent)
        if current is None:
            return parent
        have = [f for f in current["metadata"].get("finalizers") or [] if f != finalizer]
        if present and current["metadata"].get("deletionTimestamp") \
                and finalizer not in (current["metadata"].get("finalizers") or ()):
            return current  # being deleted: no new finalizer (KubeWriter's answer too)
        self._log("finalizer" if present else "unfinalize", parent)
        body = copy.deepcopy(current)
        body["metadata"]["finalizers"] = [*have, finalizer] if present else have
        stored = self.world._store_obj(body)
        if not present and not have and body["metadata"].get("deletionTimestamp"):
            self.world.delete((body["apiVersion"], body["kind"]), body["metadata"]["name"],
                              body["metadata"].get("namespace"))
        return stored

    def post_event(self, parent: Obj, note: Note) -> None:
        self.world.events.append((parent["metadata"]["name"], note))


def _spec_of(obj: Obj) -> Obj:
    """What a change of bumps ``metadata.generation``: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _merge(base: Obj, patch: Obj) -> Obj:
    """A JSON merge patch (RFC 7386), as the API server applies one: null removes a key."""
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict):
            base[key] = _merge(base[key] if isinstance(base.get(key), dict) else {}, value)
        else:
            base[key] = value
    return base


def _slot_of(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


def _drop_unnamed(current: Obj, before: Obj, now: Obj) -> None:
    """Remove from ``current`` the map keys ``before`` applied and ``now`` no longer names."""
    for key, old in before.items():
        if key not in now:
            current.pop(key, None)
        elif isinstance(old, dict) and isinstance(now[key], dict) \
                and isinstance(current.get(key), dict):
            _drop_unnamed(current[key], old, now[key])


__all__ = ["World"]
