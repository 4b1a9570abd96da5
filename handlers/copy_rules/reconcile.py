"""Converge the copies of one CopyRule within a scope, and keep its status true.

A scope limits which slots (target namespace x source name) one event makes us look at, so
that the cost of an event follows what it can have changed:

* the rule itself changed (or a periodic resync): every slot; one namespace list (a get per
  namespace instead when the rule only names its targets), one label-selector list of the
  rule's copies, one list per source namespace;
* a source ``ns/name`` changed: slots named ``name`` in every namespace; one namespace list
  and one cluster-wide ``fieldSelector=metadata.name=<name>`` list, which returns the copies
  *and* any same-named object we do not own (conflicts) in one request;
* a namespace changed: slots in that namespace only; no namespace listing;
* a copy (or any same-named object) changed: that one slot.

Nothing is remembered between events: every read is fresh, writes are creates (which fail
if the name is taken), server-side applies to copies we own and deletes with uid
preconditions, so two router replicas handling events of the same rule
at once converge to the same state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eventop.handlers.copy_rules.desired import (
    API_VERSION,
    KIND,
    SOURCE_ANNOTATION,
    Plan,
    Slot,
    SpecError,
    copies_selector,
    desired_copies,
    desired_copy,
    in_sync,
    is_source,
    is_terminating,
    owned_by,
    plan,
    rule_kind,
    rule_selector,
    source_namespaces,
    winning_sources,
)
from eventop.kube import errors, now_rfc3339
from eventop.kube.objects import label_selector_string, set_condition

log = logging.getLogger("eventop.copy_rules")

Obj = dict[str, Any]

MAX_WARNING_EVENTS = 10  # per reconcile; more conflicts are summed up in one Event


@dataclass(frozen=True)
class Scope:
    """Which slots a reconcile looks at: ``None`` means "all" on that axis."""
    name: str | None = None
    namespace: str | None = None

    def covers(self, slot: Slot) -> bool:
        return ((self.name is None or slot.name == self.name)
                and (self.namespace is None or slot.namespace == self.namespace))

    @property
    def full(self) -> bool:
        return self.name is None and self.namespace is None


class Reads:
    """Reads for the rules handled for ONE event, memoised so that several rules sharing a
    namespace list or a source namespace cost one request. Dropped after the event: there
    is no state across events (another replica may have changed everything meanwhile)."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self._memo: dict[tuple[Any, ...], Any] = {}

    def _cached(self, key: tuple[Any, ...], fetch: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = fetch()
        return self._memo[key]

    def namespaces(self) -> list[Obj]:
        return list(self._cached(("namespaces",), lambda: self.kube.list("v1", "Namespace")))

    def namespace(self, name: str) -> Obj | None:
        listed = self._memo.get(("namespaces",))
        if listed is not None:
            index = self._cached(("namespace-index",),
                                 lambda: {n["metadata"]["name"]: n for n in listed})
            return index.get(name)  # type: ignore[no-any-return]
        return self._cached(("namespace", name),  # type: ignore[no-any-return]
                            lambda: self.kube.get_or_none("v1", "Namespace", name))

    def listed(self, kind: str, namespace: str | None, label_selector: str = "",
               field_selector: str = "") -> list[Obj]:
        key = ("list", kind, namespace, label_selector, field_selector)
        return list(self._cached(key, lambda: self.kube.list(
            "v1", kind, namespace, label_selector=label_selector or None,
            field_selector=field_selector or None)))

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self._cached(("get", kind, namespace, name),  # type: ignore[no-any-return]
                            lambda: self.kube.get_or_none("v1", kind, name, namespace))

    def forget_objects(self) -> None:
        """Drop memoised ConfigMaps/Secrets after writes (namespaces and rules stay valid)."""
        for key in [k for k in self._memo if k[0] in ("list", "get")]:
            del self._memo[key]


@dataclass
class Result:
    rule: str
    scope: Scope
    sources: int = 0
    created: int = 0
    updated: int = 0
    deleted: int = 0
    in_sync: int = 0
    conflicts: list[Slot] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    status_written: bool = False

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted

    def summary(self) -> str:
        text = (f"{self.rule}: {self.created} created, {self.updated} updated, "
                f"{self.deleted} deleted, {self.in_sync} in sync")
        if self.conflicts:
            text += f", {len(self.conflicts)} conflicts"
        if self.errors:
            text += f", {len(self.errors)} errors"
        return text


def list_rules(kube: Any) -> list[Obj]:
    """Every CopyRule; none if the CRD is not installed (then there is nothing to copy)."""
    try:
        return list(kube.list(API_VERSION, KIND))
    except errors.NotFound:
        return []


def rule_sources(rule: Obj, scope: Scope, reads: Reads) -> list[Obj]:
    """The rule's sources within scope, read from the API server (never from an event)."""
    kind = rule_kind(rule)
    found: list[Obj] = []
    for ns in source_namespaces(rule):
        if scope.name is not None:
            obj = reads.get(kind, ns, scope.name)
            candidates = [obj] if obj is not None else []
        else:
            try:
                selector = label_selector_string(rule_selector(rule))
            except ValueError as exc:
                raise SpecError(f"spec.selector: {exc}") from None
            try:
                candidates = reads.listed(kind, ns, label_selector=selector)
            except errors.Invalid as exc:  # e.g. an In expression with no values
                raise SpecError(f"spec.selector is refused by the API server: {exc}") from None
        found += [obj for obj in candidates if is_source(rule, obj)]
    return found


def _slot(obj: Obj) -> Slot:
    meta = obj["metadata"]
    return Slot(meta["namespace"], meta["name"])


def _existing(rule: Obj, scope: Scope, desired: dict[Slot, Obj],
              reads: Reads) -> tuple[dict[Slot, Obj], list[Obj]]:
    """Objects at the wanted slots (ours or not) and our copies in scope that could be pruned."""
    kind = rule_kind(rule)
    if scope.name is not None and scope.namespace is not None:
        obj = reads.get(kind, scope.namespace, scope.name)
        found = [obj] if obj is not None else []
        prunable = found
    elif scope.name is not None:
        # With a source: every object of that name (ours and others', for conflicts). Without
        # (an unrelated object in a source namespace, or a source deleted/unlabelled): only
        # our copies of that name, so a kube-root-ca.crt event never lists one per namespace.
        label = "" if desired else copies_selector(rule)
        found = reads.listed(kind, None, label_selector=label,
                             field_selector=f"metadata.name={scope.name}")
        prunable = found
    elif scope.namespace is not None:
        found = reads.listed(kind, scope.namespace)
        prunable = found
    else:
        prunable = reads.listed(kind, None, label_selector=copies_selector(rule))
        found = list(prunable)
        have = {_slot(o) for o in found}
        missing_names = sorted({s.name for s in desired if s not in have})
        for name in missing_names:  # only where a copy is missing: steady state reads none
            found += reads.listed(kind, None, field_selector=f"metadata.name={name}")
    existing: dict[Slot, Obj] = {}
    for obj in found:
        slot = _slot(obj)
        if scope.covers(slot) and slot in desired:
            existing[slot] = obj
    return existing, [o for o in prunable if scope.covers(_slot(o))]


def _target_namespaces(rule: Obj, scope: Scope, reads: Reads) -> list[Obj]:
    """Candidate target namespaces: the one in scope, the few a rule names (no selector), or
    all of them (one list, shared by every rule handled for the event)."""
    if scope.namespace is not None:
        names = [scope.namespace]
    else:
        targets = (rule.get("spec") or {}).get("targetNamespaces") or {}
        if not targets.get("names") or targets.get("selector") is not None:
            return reads.namespaces()
        names = list(dict.fromkeys(targets["names"]))
    found = [reads.namespace(name) for name in names]
    return [ns for ns in found if ns is not None]


def reconcile(kube: Any, rule: Obj, scope: Scope, reads: Reads | None = None, *,
              was_copy: bool = False) -> Result:
    """Converge the rule's copies within ``scope``; update its status when anything changed.

    ``was_copy``: the event was about an object that carried this rule's copy label. If the
    scope now holds no copy of the rule (replaced or deleted by someone, in a namespace that
    no longer wants one), the copy count fell without any write of ours: recount. An echo of
    our own write still finds its copy, so the 1,000 echoes of a fan-out recount nothing.

    Raises :class:`SpecError` for a rule that can not be acted on (after recording it in the
    status) and lets :class:`eventop.kube.errors.Unavailable` through so the event is redelivered.
    """
    reads = reads or Reads(kube)
    name = rule["metadata"]["name"]
    result = Result(name, scope)
    try:
        sources = rule_sources(rule, scope, reads)
        namespaces = _target_namespaces(rule, scope, reads)
        desired = {s: o for s, o in desired_copies(rule, sources, namespaces).items()
                   if scope.covers(s)}
    except SpecError as exc:
        kube.patch_status_if_changed(rule, _invalid_status(rule, str(exc)))
        raise
    result.sources = len({(s["metadata"]["namespace"], s["metadata"]["name"]) for s in sources})
    existing, prunable = _existing(rule, scope, desired, reads)
    the_plan = plan(rule, desired, existing, prunable)
    _execute(kube, rule, the_plan, result, reads)
    lost = was_copy and not any(owned_by(o, rule) for o in [*existing.values(), *prunable])
    if result.writes:
        reads.forget_objects()
    _update_status(kube, rule, scope, result, reads, recount=lost)
    return result


def _execute(kube: Any, rule: Obj, the_plan: Plan, result: Result, reads: Reads) -> None:
    """Apply the plan. One slot failing (a 403 from a terminating namespace, a 422) is
    counted and reported; the others still converge. Unavailable propagates (retry)."""
    result.in_sync = len(the_plan.in_sync)
    result.conflicts = list(the_plan.conflicts)
    for want in the_plan.create:
        slot = _slot(want)
        try:
            if _create(kube, rule, want):
                result.created += 1
        except _SlotTaken:
            result.conflicts.append(slot)
        except errors.Unavailable:
            raise
        except errors.KubeError as exc:
            _slot_error(result, slot, "create", exc)
    for want in the_plan.update:
        try:
            _update(kube, want)
            result.updated += 1
        except errors.Unavailable:
            raise
        except errors.KubeError as exc:
            _slot_error(result, _slot(want), "update", exc)
    for have, want in the_plan.recreate:
        try:
            _delete(kube, have)
            if _create(kube, rule, want):
                result.updated += 1
        except errors.Unavailable:
            raise
        except (errors.KubeError, _SlotTaken) as exc:
            _slot_error(result, _slot(want), "recreate", exc)
    for obj in the_plan.delete:
        slot = _slot(obj)
        # Copies in namespaces being deleted go with the namespace (the namespace controller
        # deletes them; our delete would only race it).
        namespace = reads.namespace(slot.namespace)
        if namespace is None or is_terminating(namespace):
            continue
        try:
            if _delete(kube, obj):
                result.deleted += 1
        except errors.Unavailable:
            raise
        except errors.KubeError as exc:
            _slot_error(result, slot, "delete", exc)
    result.conflicts.sort(key=str)


class _SlotTaken(Exception):
    """Someone else's object appeared at the slot between our read and our write."""


def _create(kube: Any, rule: Obj, want: Obj) -> bool:
    """Create the copy with POST, which answers 409 AlreadyExists if anything was created at
    this name since we looked. Server-side apply can not say "only if absent": without force
    it conflicts only on fields another manager owns with a different value, so it would
    merge the copy (and the rule's ownerReference, hence deletion with the rule) into an
    object sharing no field with it. If the object that got there first is ours (another
    replica's copy), it is updated instead, unless it already is what we would write.
    False if the namespace is gone.

    Later writes to the copy are applies (:func:`_update`); the fields created here stay
    owned by the create as well, so a key that later leaves the source is removed by
    :func:`_update`'s replace fallback."""
    meta = want["metadata"]
    try:
        kube.create(want)
    except errors.Conflict:
        current = kube.get_or_none("v1", want["kind"], meta["name"], meta["namespace"])
        if current is None or not owned_by(current, rule):
            raise _SlotTaken(f"{meta['namespace']}/{meta['name']}") from None
        if in_sync(current, want):
            # Another reconcile (a concurrent event, another replica) made this very copy:
            # applying it again would change nothing but its managedFields, a write every
            # watcher sees. Found by the fault suite (16 namespaces created at once).
            return True
        _update(kube, want)
    except errors.NotFound:
        return False  # the namespace went away meanwhile: nothing to copy into
    log.info("created %s %s/%s from %s", want["kind"], meta["namespace"], meta["name"],
             meta["annotations"].get(SOURCE_ANNOTATION))
    return True


def _update(kube: Any, want: Obj) -> None:
    """Force-apply our fields; if a hand edit left fields we do not own (an extra data key
    added with kubectl edit), server-side apply can not remove them, so replace the object
    once with a resourceVersion precondition."""
    meta = want["metadata"]
    written = kube.apply(want, force=True)
    if not in_sync(written, want):
        fixed = dict(want)
        fixed["metadata"] = {**written["metadata"], **{
            k: want["metadata"][k] for k in ("labels", "annotations", "ownerReferences")}}
        fixed["metadata"]["labels"] = {**(written["metadata"].get("labels") or {}),
                                       **want["metadata"]["labels"]}
        fixed["metadata"]["annotations"] = {**(written["metadata"].get("annotations") or {}),
                                            **want["metadata"]["annotations"]}
        fixed["metadata"].pop("managedFields", None)
        try:
            kube.replace(fixed)
        except errors.Conflict:
            # Changed again since our apply: that change is an event of its own, whose
            # reconcile finishes the job. Not an error worth reporting.
            log.info("%s %s/%s changed while being restored; its next event restores it",
                     want["kind"], meta["namespace"], meta["name"])
            return
    # Names only: never contents, nor their hash (a Secret's could be brute-forced offline).
    log.info("updated %s %s/%s from %s", want["kind"], meta["namespace"], meta["name"],
             meta["annotations"].get(SOURCE_ANNOTATION))


def _delete(kube: Any, obj: Obj) -> bool:
    meta = obj["metadata"]
    done = bool(kube.delete(obj.get("apiVersion", "v1"), obj["kind"], meta["name"],
                            meta["namespace"], uid=meta.get("uid")))
    if done:
        log.info("deleted %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
    return done


def _slot_error(result: Result, slot: Slot, verb: str, exc: Exception) -> None:
    if isinstance(exc, errors.Forbidden) and "terminat" in str(exc).lower():
        return  # the namespace is going away; nothing to report
    message = f"{verb} {slot}: {exc}"
    result.errors.append(message)
    log.warning("CopyRule %s: %s", result.rule, message)


# -- status ----------------------------------------------------------------------------


def _invalid_status(rule: Obj, message: str) -> Obj:
    status = dict(rule.get("status") or {})
    generation = (rule.get("metadata") or {}).get("generation")
    status["lastError"] = message
    status["conditions"] = set_condition(status.get("conditions"), "Ready", False, "InvalidSpec",
                                         f"{message}: fix the CopyRule's spec", now_rfc3339(),
                                         generation)
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _count_in_sync_copies(rule: Obj, reads: Reads) -> tuple[int, int]:
    """(sources, copies in sync) across the whole rule, for reconciles that saw only a part:
    one list per source namespace and one label-selector list of the copies."""
    sources = rule_sources(rule, Scope(), reads)
    winners = winning_sources(rule, sources)
    count = 0
    for copy in reads.listed(rule_kind(rule), None, label_selector=copies_selector(rule)):
        meta = copy["metadata"]
        src = winners.get(meta["name"])
        if (src is not None and owned_by(copy, rule) and not meta.get("deletionTimestamp")
                and src["metadata"]["namespace"] != meta["namespace"]
                and in_sync(copy, desired_copy(rule, src, meta["namespace"]))):
            count += 1
    return len(sources), count


def refresh_status(kube: Any, rule: Obj, reads: Reads) -> bool:
    """Recount a rule's status without reconciling: after copies went away on their own (a
    namespace deleted with its contents), nothing was written, yet the counts changed."""
    result = Result(rule["metadata"]["name"], Scope(name="", namespace=""))  # covers no slot
    try:
        _update_status(kube, rule, result.scope, result, reads, recount=True)
    except SpecError:
        return False  # reported by the rule's own reconcile
    return result.status_written


def _update_status(kube: Any, rule: Obj, scope: Scope, result: Result, reads: Reads,
                   recount: bool = False) -> None:
    old = dict(rule.get("status") or {})
    old_conflicts = set(old.get("conflictList") or [])
    new_in_scope = {str(s) for s in result.conflicts}
    kept = {c for c in old_conflicts if not scope.covers(_parse_slot(c))}
    conflicts = sorted(kept | new_in_scope)
    newly = sorted(new_in_scope - old_conflicts, key=str)

    if scope.full:
        sources, copies = result.sources, result.in_sync + result.created + result.updated
    elif (recount or result.writes or set(conflicts) != old_conflicts or result.errors
          or "observedGeneration" not in old
          or (scope.name is not None and scope.namespace is None)):
        # A source event may change the number of sources without any write (a second source
        # of the same name that loses the tie appears or goes): recount on those too.
        sources, copies = _count_in_sync_copies(rule, reads)
    else:
        return  # nothing in scope changed: the status written before is still true

    generation = (rule.get("metadata") or {}).get("generation")
    status = dict(old)
    status.update({"sources": sources, "copies": copies, "conflicts": len(conflicts),
                   "conflictList": conflicts, "errors": len(result.errors)})
    if generation is not None:
        status["observedGeneration"] = generation
    if result.errors:
        status["lastError"] = result.errors[-1][:1024]
    if result.errors:
        ready = (False, "Errors", f"{len(result.errors)} copies could not be written; last: "
                 f"{result.errors[-1][:300]}")
    elif conflicts:
        ready = (False, "Conflicts", f"{len(conflicts)} target objects exist and are not managed "
                 f"by this rule (left unchanged): {', '.join(conflicts[:5])}"
                 f"{' ...' if len(conflicts) > 5 else ''}. Delete or rename them to let the "
                 "rule create its copies.")
    else:
        ready = (True, "Synced", f"{copies} copies of {sources} sources in sync")
    status["conditions"] = set_condition(old.get("conditions"), "Ready", ready[0], ready[1],
                                         ready[2], now_rfc3339(), generation)
    result.status_written = kube.patch_status_if_changed(rule, status)
    _warn_conflicts(kube, rule, newly)


def _warn_conflicts(kube: Any, rule: Obj, newly: Iterable[str]) -> None:
    """One Warning Event per newly found conflict (a few at most, then one summary), so a
    persistent conflict does not post an Event on every resync."""
    newly = list(newly)
    kind = rule_kind(rule)
    for slot in newly[:MAX_WARNING_EVENTS]:
        kube.post_event(rule, "Warning", "CopyConflict",
                        f"{kind} {slot} exists and is not managed by CopyRule "
                        f"{rule['metadata']['name']}: left unchanged. Delete or rename it to "
                        "let the rule create its copy there.")
    if len(newly) > MAX_WARNING_EVENTS:
        kube.post_event(rule, "Warning", "CopyConflict",
                        f"{len(newly) - MAX_WARNING_EVENTS} more {kind}s exist at target names "
                        "and are not managed by this rule; see status.conflictList.")


def _parse_slot(text: str) -> Slot:
    ns, _, name = text.partition("/")
    return Slot(ns, name)
