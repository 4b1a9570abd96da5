"""Compare what a parent wants with what the cache holds: the writes one run must make.

Pure: no I/O. The rules every handler gets for free:

* a missing child is **created** (POST: fails if the name was taken meanwhile);
* an object at a child's name that this parent does not own is a **conflict**: never
  written, reported (unless the controller's ``adopts`` function takes it over);
* an owned child that differs is **applied**, **replaced** or **recreated** (its ``mode``);
* owned children no longer wanted are **deleted** (uid precondition);
* an object the parent does not own is written only by an explicit ``patch`` of the fields
  it names, and only where they differ;
* nothing is written into a namespace being deleted, nor into an object being deleted;
* nothing is written into a desired Namespace child that is a conflict (someone else's
  namespace): its children are conflicts too, held back, so that a spec naming another
  team's namespace grants nothing there.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from eventop.engine.controller import (
    APPLIED_ANNOTATION,
    CONTROLLER_ANNOTATION,
    PARENT_UID_LABEL,
    Controller,
)
from eventop.engine.desired import Child, Conflict, Desired
from eventop.engine.reads import Reads
from eventop.kube.objects import content_hash, owner_reference

Obj = dict[str, Any]
Verb = Literal["create", "apply", "replace", "recreate", "delete", "patch"]

_NOT_CONTENT = frozenset({"apiVersion", "kind", "metadata", "status"})


@dataclass
class Action:
    """One write: ``desired`` is the body to send, ``existing`` what the cache holds."""

    verb: Verb
    kind: str
    namespace: str
    name: str
    desired: Obj | None = None
    existing: Obj | None = None
    child: Child | None = None
    #: Takes over an object this parent does not own yet (see ``write``: rechecked first).
    adopt: bool = False


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    unchanged: list[Obj] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    skipped: list[Obj] = field(default_factory=list)
    #: Objects at a child's name that are not the parent's and are being deleted (skipped):
    #: their deletion, which may be the next event about them, runs the parent again.
    departing: list[Conflict] = field(default_factory=list)


def plan(ctl: Controller, parent: Obj, desired: Desired, reads: Reads, *,
         terminating: Callable[[str], bool] = lambda _ns: False,
         unseen: Callable[[str], bool] = lambda _ns: False,
         prune: bool = True) -> Plan:
    """The writes that make the cluster hold ``desired``'s children for ``parent``.

    ``unseen(ns)``: the cache of Namespaces does not hold ``ns`` (yet). A child there is
    never pruned: the function decided from a Namespace cache behind the child's (another
    replica made the child in a namespace created a moment ago), and a namespace that is
    really gone takes its children with it."""
    result = Plan()
    uid = str(parent["metadata"]["uid"])
    wanted: set[tuple[str, str, str, str]] = set()
    for child in desired.child_list():
        body = prepare(child, parent, ctl)
        meta = body["metadata"]
        api_version, kind = body["apiVersion"], body["kind"]
        ns, name = meta.get("namespace") or "", meta["name"]
        slot = (api_version, kind, ns, name)
        if slot in wanted:
            raise ValueError(f"{ctl.name}: two desired children are {kind} {ns}/{name}")
        wanted.add(slot)
        if not any(k.key == (api_version, kind) for k in ctl.owns):
            declared = [str(k) for k in ctl.owns]
            close = difflib.get_close_matches(f"{api_version}/{kind}", declared, n=1)
            raise ValueError(f"handler {ctl.name!r} wants a child of kind {api_version}/{kind}, "
                             "which it does not declare: "
                             + (f"did you mean {close[0]}? Else add it to owns=[...]" if close
                                else "add it to owns=[...]"))
        namespaced = reads.namespaced((api_version, kind))
        if namespaced is not None and namespaced != bool(ns):
            raise ValueError(
                f"handler {ctl.name!r} wants {kind} {name} without metadata.namespace, but "
                f"{kind} is namespaced: give it the namespace it belongs in" if namespaced else
                f"handler {ctl.name!r} wants {kind} {name} in namespace {ns!r}, but {kind} is "
                "cluster-scoped: leave metadata.namespace out")
        if child.owned and not ns and parent["metadata"].get("namespace"):
            raise ValueError(
                f"handler {ctl.name!r} wants {kind} {name} without a namespace as an owned "
                f"child of the namespaced {parent['kind']} {_name(parent)}: Kubernetes' garbage "
                "collector ignores a namespaced owner of a cluster-scoped object (it would "
                "never be deleted). Give it metadata.namespace if its kind is namespaced, else "
                "Child(obj, owned=False) (labelled, outlives the parent, never pruned) or a "
                "cluster-scoped parent")
        existing = reads.get((api_version, kind), name, ns or None)
        if existing is None:
            if ns and terminating(ns):
                result.skipped.append(body)
            else:
                result.actions.append(Action("create", kind, ns, name, body, None, child))
            continue
        ours = is_ours(existing, uid)
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            result.skipped.append(body)  # created again once it is gone
            if not ours:
                result.departing.append(Conflict(kind, ns, name, "is being deleted"))
            continue
        other = _other_controller(ctl, existing) if ours else None
        if other:
            result.conflicts.append(Conflict(kind, ns, name, f"is controller {other}'s child "
                                             f"of {parent['kind']} {_name(parent)}"))
            continue
        if not ours:
            if ctl.adopt_fn is not None and ctl.adopt_fn(parent, existing):
                # An orphan that can not be changed in place (an immutable copy of a source
                # made again) is adopted by being made again, as an owned child would be:
                # only when its content differs (ownership is what adopting changes; an
                # orphan already as desired keeps running, a Job its pods).
                differs = child.recreate and not in_sync(
                    child, existing, {**body, "metadata": existing.get("metadata") or {}})
                verb: Verb = ("recreate" if differs
                              else "replace" if child.mode == "replace" else "apply")
                result.actions.append(Action(verb, kind, ns, name, body, existing, child,
                                             adopt=True))
            else:
                result.conflicts.append(Conflict(kind, ns, name, "exists and is not managed "
                                                 f"by {parent['kind']} {_name(parent)}"))
            continue
        if child.mode == "create" or in_sync(child, existing, body):
            result.unchanged.append(existing)
        elif child.recreate:
            result.actions.append(Action("recreate", kind, ns, name, body, existing, child))
        else:
            result.actions.append(Action(child.mode, kind, ns, name, body, existing, child))
    if prune and desired.prune:
        for k in ctl.owns:
            if k.optional and not reads.served(k):
                continue  # an add-on's kind this API server does not serve: none exist
            for obj in reads.list(k, owner=uid):
                meta = obj["metadata"]
                ns = meta.get("namespace") or ""
                if ((k.api_version, k.kind, ns, meta["name"]) in wanted
                        or meta.get("deletionTimestamp")
                        or (ns and (terminating(ns) or unseen(ns)))
                        or (k.key in ctl.shared and _annotated(obj) != ctl.name)):
                    continue  # (another controller's child, or one from before they shared)
                result.actions.append(Action("delete", k.kind, ns, meta["name"], None, obj))
    for obj in desired.delete:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ""
        current = reads.get((obj["apiVersion"], obj["kind"]), meta["name"], ns or None)
        if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if not is_ours(current, uid):
            result.conflicts.append(Conflict(obj["kind"], ns, meta["name"],
                                             "not deleted: not managed by this parent"))
            continue
        result.actions.append(Action("delete", obj["kind"], ns, meta["name"], None, current))
    for obj in desired.patch:
        _plan_patch(ctl, obj, reads, result)
    _hold_back_in_foreign_namespaces(result)
    return result


def _hold_back_in_foreign_namespaces(result: Plan) -> None:
    """Children to be written into a desired Namespace that is a conflict (it exists and is
    not this parent's) are held back as conflicts: the spec named a namespace someone else
    made, and writing there (a RoleBinding, a quota) would act on theirs."""
    foreign = {c.name for c in result.conflicts if c.kind == "Namespace" and not c.namespace}
    if foreign:
        result.actions, held = held_back(result.actions, foreign, "is not this parent's")
        result.conflicts += held


def held_back(actions: list[Action], namespaces: set[str],
              why: str) -> tuple[list[Action], list[Conflict]]:
    """``actions`` without the writes into ``namespaces``, and those as conflicts (``held
    back: Namespace N <why>``). Deletes of the parent's own children stay. The one rule for
    the plan (a Namespace the cache shows as someone else's) and for ``execute`` (one whose
    create found it made by someone else meanwhile)."""
    kept, held = [], []
    for a in actions:
        if a.namespace in namespaces and a.verb != "delete":
            held.append(Conflict(a.kind, a.namespace, a.name,
                                 f"held back: Namespace {a.namespace} {why}"))
        else:
            kept.append(a)
    return kept, held


def _plan_patch(ctl: Controller, obj: Obj, reads: Reads, result: Plan) -> None:
    """A patch of an object someone else made, if the cache shows it does not hold the
    fields yet (a missing or departing object is left alone: nothing to keep it from)."""
    meta = obj.get("metadata") or {}
    if not (obj.get("apiVersion") and obj.get("kind") and meta.get("name")):
        raise ValueError(f"{ctl.name}: a patch needs apiVersion, kind and metadata.name, got "
                         f"{obj!r}")
    if not any(k.key == (obj["apiVersion"], obj["kind"]) for k in ctl.reads):
        raise ValueError(f"handler {ctl.name!r} patches {obj['apiVersion']}/{obj['kind']}, "
                         "which it does not declare: add it to reads=[...]")
    ns = meta.get("namespace") or ""
    current = reads.get((obj["apiVersion"], obj["kind"]), meta["name"], ns or None)
    if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
        return
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    wanted_meta = {k: v for k, v in meta.items() if k in ("labels", "annotations")}
    if wanted_meta:
        fields["metadata"] = wanted_meta
    if contains(current, fields):
        result.unchanged.append(current)
        return
    body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], **fields,
            "metadata": {**wanted_meta, "name": meta["name"],
                         **({"namespace": ns} if ns else {})}}
    result.actions.append(Action("patch", obj["kind"], ns, meta["name"], body, current))


def prepare(child: Child, parent: Obj, ctl: Controller | None = None) -> Obj:
    """The body to write: the child with its ownerReference (or parent-uid label) added, and
    the controller's name where another controller of the parent kind owns its kind too."""
    obj = dict(child.obj)
    meta = dict(obj["metadata"])
    if ctl is not None and (obj.get("apiVersion"), obj.get("kind")) in ctl.shared:
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               CONTROLLER_ANNOTATION: ctl.name}
    uid = str(parent["metadata"]["uid"])
    if child.owned:
        refs = list(meta.get("ownerReferences") or [])
        if not any(r.get("uid") == uid for r in refs):
            refs.append(owner_reference(parent))
        meta["ownerReferences"] = refs
    else:
        meta["labels"] = {**(meta.get("labels") or {}), PARENT_UID_LABEL: uid}
    obj["metadata"] = meta
    if child.mode in ("apply", "create"):
        # (a "create" child too: a handler may apply it once made, as the databases handler
        # does with a credentials Secret it generated; its first run in apply mode then finds
        # it as applied, instead of applying it again only because the digest is missing)
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               APPLIED_ANNOTATION: applied_hash(obj)}
    return obj


def applied_hash(body: Obj) -> str:
    """A short, stable digest of a body to apply (its keys in any order)."""
    return content_hash(body)[:16]


def _annotated(obj: Obj) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(CONTROLLER_ANNOTATION)


def _other_controller(ctl: Controller, existing: Obj) -> str | None:
    """The other controller (of the same parent kind) whose child ``existing`` is, if any."""
    if (existing.get("apiVersion"), existing.get("kind")) not in ctl.shared:
        return None
    name = _annotated(existing)
    return name if name and name != ctl.name else None


def is_ours(obj: Obj, parent_uid: str) -> bool:
    """Owned by the parent (any ownerReference to its uid), or labelled as its child."""
    meta = obj.get("metadata") or {}
    if any(r.get("uid") == parent_uid for r in meta.get("ownerReferences") or ()):
        return True
    return (meta.get("labels") or {}).get(PARENT_UID_LABEL) == parent_uid


def in_sync(child: Child, existing: Obj, desired: Obj) -> bool:
    """Is ``existing`` already as ``desired``? (``child.matches`` decides, if given.)"""
    if child.matches is not None:
        return bool(child.matches(existing, desired))
    if not metadata_contains(existing.get("metadata") or {}, desired["metadata"]):
        return False
    if child.mode == "replace":
        keys = (set(existing) | set(desired)) - _NOT_CONTENT
        return all(existing.get(k) == desired.get(k) for k in keys)
    return all(contains(existing.get(k), v) for k, v in desired.items() if k not in _NOT_CONTENT)


def metadata_contains(have: Obj, want: Obj) -> bool:
    """Labels and annotations of ``want`` present in ``have``, its owners and finalizers too."""
    for key in ("labels", "annotations"):
        mine = have.get(key) or {}
        if any(mine.get(k) != v for k, v in (want.get(key) or {}).items()):
            return False
    owners = {r.get("uid") for r in have.get("ownerReferences") or ()}
    if any(r.get("uid") not in owners for r in want.get("ownerReferences") or ()):
        return False
    return set(want.get("finalizers") or ()) <= set(have.get("finalizers") or ())


def contains(have: Any, want: Any) -> bool:
    """Server-side apply's view of "already set": every field of ``want`` has its value in
    ``have`` (fields the server or other managers added are ignored); lists item by item.
    An empty map or list is set when absent: the API server stores ``data: {}`` as no
    ``data`` at all, and applying it again would write for nothing, every run."""
    if isinstance(want, dict):
        if not want:
            return have is None or isinstance(have, dict)
        return isinstance(have, dict) and all(contains(have.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        if not want:
            return have is None or have == []
        return (isinstance(have, list) and len(have) == len(want)
                and all(contains(h, w) for h, w in zip(have, want, strict=True)))
    return bool(have == want)


def replacement(existing: Obj, desired: Obj) -> Obj:
    """The PUT body for ``"replace"``: exactly the desired content; the existing metadata
    (resourceVersion precondition, others' labels, annotations, owners, finalizers) kept,
    ours merged in, and another controller's reference replaced by ours."""
    body = {k: v for k, v in desired.items() if k != "metadata"}
    old, new = existing.get("metadata") or {}, desired["metadata"]
    meta = {k: v for k, v in old.items() if k != "managedFields"}
    for key in ("labels", "annotations"):
        merged = {**(old.get(key) or {}), **(new.get(key) or {})}
        if merged:
            meta[key] = merged
    refs = list(old.get("ownerReferences") or [])
    ours = list(new.get("ownerReferences") or ())
    if any(r.get("controller") for r in ours):
        # An object has one controller: taking it over (adopts) drops the earlier one's
        # reference, which the API server would otherwise refuse next to ours.
        mine = {r.get("uid") for r in ours}
        refs = [r for r in refs if not r.get("controller") or r.get("uid") in mine]
    known = {r.get("uid") for r in refs}
    refs += [r for r in ours if r.get("uid") not in known]
    if refs:
        meta["ownerReferences"] = refs
    body["metadata"] = meta
    return body


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])
