"""CopyRule on the reconcile engine: what a rule wants, from cached reads, and its status.

One run per rule, whatever changed (a namespace, a source, a copy, the rule): every read is
from the router's cache, so a full run costs no API request, and the engine writes only the
copies that differ. Which rules a change concerns:

* a CopyRule: itself;
* a Namespace: every rule that may target it (its name; its labels are the run's business);
* a ConfigMap/Secret: the rule owning it (a copy: engine default), the rules reading its
  namespace as a source namespace, and the rules one of whose sources has its name (it sits
  at a slot: a conflict, or a conflict that went away).

A rule being deleted needs nothing: its copies carry ownerReferences to it, so the garbage
collector removes them (and ``--cascade=orphan`` keeps them, as the user asked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eventop.engine import Child, Controller, Desired, Kind, Note, Outcome, Reads
from eventop.handlers.copy_rules.desired import (
    API_VERSION,
    KIND,
    RULE_ANNOTATION,
    RULE_LABEL,
    SOURCE_ANNOTATION,
    SpecError,
    adoptable,
    desired_copies,
    in_sync,
    is_copy,
    is_source,
    may_target,
    needs_recreate,
    rule_kind,
    rule_label_value,
    rule_selector,
    source_namespaces,
    validate_selector,
)
from eventop.handlers.registry import Registry
from eventop.kube import now_rfc3339, set_condition

Obj = dict[str, Any]
RULES = f"{API_VERSION}/{KIND}"
MAX_WARNING_EVENTS = 10  # per run; more new conflicts are summed up in one Event

registry = Registry()
rules = Controller(
    "copy-rules", parent=RULES, owns=["v1/ConfigMap", "v1/Secret"],
    reads=[Kind("v1/Namespace", metadata_only=True)],
    conflict_events=False,  # CopyConflict Events with the rule's own wording, see _notes
    refusal_events=True,  # a copy refused (a quota, an immutable field): WriteRefused Events
    # Copies are read from the cache alone: a rule's runs may overlap, so a namespace created
    # while a run waits for a slow copy elsewhere is copied at once.
    overlap=True,
    registry=registry)


@rules.reconcile
def copies(rule: Obj, reads: Reads) -> Desired:
    """Every copy the rule asks for; the status counts what is in place after the run."""
    try:
        kind = rule_kind(rule)
        validate_selector(rule_selector(rule), "spec.selector")
        validate_selector(((rule.get("spec") or {}).get("targetNamespaces") or {}).get(
            "selector") or {}, "spec.targetNamespaces.selector")
        sources = rule_sources(rule, reads)
        targets = reads.list("v1/Namespace")
        wanted = desired_copies(rule, sources, targets)
    except SpecError as exc:  # the user must fix the rule: nothing is written or pruned
        return Desired(status=invalid_status(rule, str(exc)), prune=False,
                       events=[Note("Warning", "InvalidSpec", f"{exc}: fix the CopyRule's "
                                    "spec; its copies are kept as they are meanwhile")],
                       summary=f"invalid spec: {exc}")
    children = []
    for slot, want in wanted.items():
        have = reads.get(("v1", kind), slot.name, slot.namespace)
        children.append(Child(want, mode="replace", matches=in_sync,
                              recreate=have is not None and needs_recreate(have, want),
                              reason=f"from {want['metadata']['annotations'][SOURCE_ANNOTATION]}"))
    found = len({(s["metadata"]["namespace"], s["metadata"]["name"]) for s in sources})
    notes = _spec_notes(rule, {n["metadata"]["name"] for n in targets})
    return Desired(children, status=lambda outcome: rule_status(
                       rule, found, outcome, notes,
                       rival=lambda slot: _rival(kind, slot, rule, reads)),
                   events=lambda outcome: _notes(rule, kind, outcome, reads))


@rules.adopts
def adopt(rule: Obj, obj: Obj) -> bool:
    """Orphans naming the rule in label and annotation (see ``desired``'s docstring)."""
    return adoptable(obj, rule)


@rules.maps("v1/Namespace", metadata_only=True)
def rules_of_namespace(namespace: Obj, reads: Reads) -> list[Obj]:
    """Rules it may be a target of, and rules reading sources in it (whose status says
    whether the namespaces they name exist)."""
    name = namespace["metadata"]["name"]
    return [r for r in reads.list(RULES) if may_target(r, name) or _reads_from(r, name)]


def _reads_from(rule: Obj, namespace: str) -> bool:
    try:
        return namespace in source_namespaces(rule)
    except SpecError:
        return False  # reported by the rule's own run


@rules.maps("v1/ConfigMap")
@rules.maps("v1/Secret")
def rules_of_object(obj: Obj, reads: Reads) -> list[Obj]:
    """Rules whose source namespace holds it, or one of whose sources has its name."""
    meta = obj["metadata"]
    ns, name = meta.get("namespace"), meta["name"]
    found = []
    for rule in reads.list(RULES):
        try:
            if rule_kind(rule) != obj["kind"]:
                continue
            if ns in source_namespaces(rule) or (
                    may_target(rule, ns or "") and name in source_names(rule, reads)):
                found.append(rule)
        except SpecError:
            continue  # reported by the rule's own run
    return found


def rule_sources(rule: Obj, reads: Reads) -> list[Obj]:
    """The rule's sources, as the cache holds them (filled by the API server, never by an
    event: a forged event can at most cause one more run)."""
    kind = ("v1", rule_kind(rule))
    selector = rule_selector(rule)
    return [obj for ns in source_namespaces(rule)
            for obj in reads.list(kind, ns, selector=selector) if is_source(rule, obj)]


def source_names(rule: Obj, reads: Reads) -> set[str]:
    return {s["metadata"]["name"] for s in rule_sources(rule, reads)}


# -- status ----------------------------------------------------------------------------


def invalid_status(rule: Obj, message: str) -> Obj:
    status = dict(rule.get("status") or {})
    generation = (rule.get("metadata") or {}).get("generation")
    status["lastError"] = message
    status["conditions"] = set_condition(status.get("conditions"), "Ready", False, "InvalidSpec",
                                         f"{message}: fix the CopyRule's spec", now_rfc3339(),
                                         generation)
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _spec_notes(rule: Obj, existing: set[str]) -> list[str]:
    """What in the spec copies nothing, said in the status whatever else it says: the
    namespaces it names (sources, then targets) that do not exist (not an error: they may be
    created later, but a typo otherwise reads as a rule in sync with nothing to copy), and
    target names that are source namespaces (no copy goes into a source namespace)."""
    spec = rule.get("spec") or {}
    sources = source_namespaces(rule)
    named_targets = [str(n) for n in (spec.get("targetNamespaces") or {}).get("names") or []]
    notes = []
    missing = sorted({str(n) for n in [*sources, *named_targets]} - existing)
    if missing:
        notes.append(f"namespace(s) named in the spec do not exist: {', '.join(missing)}")
    targets = spec.get("targetNamespaces") or {}
    if targets.get("names") == [] and not targets.get("selector"):
        notes.append("targetNamespaces.names is empty, which names no namespace: omit it for "
                     "the default targets")
    publishing = [n for n in named_targets if n in sources]
    if publishing:
        notes.append(f"targetNamespaces.names names the source namespace(s) "
                     f"{', '.join(publishing)}: no copy goes into a source namespace")
    return notes


def rule_status(rule: Obj, sources: int, outcome: Outcome, notes: Sequence[str] = (),
                rival: Callable[[str], str | None] = lambda slot: None) -> Obj:
    """Counts of what is in place now, the conflicts (objects at a copy's name that the rule
    does not manage) and the writes the API server refused; ``notes`` on the spec
    (:func:`_spec_notes`) end the message whatever it says. ``rival`` names the other
    CopyRule whose copy holds a slot, if one does: the way out differs (narrow a rule, not
    delete its copy, which that rule would make again)."""
    old = dict(rule.get("status") or {})
    conflicts = sorted(str(c) for c in outcome.conflicts)
    errors = [str(e) for e in outcome.refused]  # (a lost race mends itself: not counted)
    copies = len(outcome.in_place)
    generation = (rule.get("metadata") or {}).get("generation")
    status = dict(old)
    status.update({"sources": sources, "copies": copies, "conflicts": len(conflicts),
                   "conflictList": conflicts, "errors": len(errors)})
    if generation is not None:
        status["observedGeneration"] = generation
    if errors:
        status["lastError"] = errors[-1][:1024]
        ready = (False, "Errors", f"{len(errors)} copies could not be written; last: "
                 f"{errors[-1][:300]}")
    elif conflicts:
        ready = (False, "Conflicts", _conflicts_message(conflicts, rival))
    elif sources == 0:
        ready = (True, "Synced", f"no source: no {rule_kind(rule)} in "
                 f"{', '.join(source_namespaces(rule))} matches the selector, so there is "
                 "nothing to copy")
    else:
        ready = (True, "Synced", f"{copies} copies of {sources} sources in sync")
    message = "; ".join([ready[2].rstrip("."), *notes]) if notes else ready[2]
    status["conditions"] = set_condition(old.get("conditions"), "Ready", ready[0], ready[1],
                                         message, now_rfc3339(), generation)
    return status


def _conflicts_message(conflicts: list[str], rival: Callable[[str], str | None]) -> str:
    """The Conflicts condition's message: unmanaged objects are the user's to delete or
    rename; another rule's copies are not (it would make them again): a rule is narrowed."""
    rivals = {slot: rival(slot) for slot in conflicts}
    foreign = [slot for slot, other in rivals.items() if other is None]
    taken = [slot for slot, other in rivals.items() if other is not None]
    parts = []
    if foreign:
        parts.append(f"{len(foreign)} target objects exist and are not managed by this rule "
                     f"(left unchanged): {_first(foreign)}. Delete or rename them to let the "
                     "rule create its copies")
    if taken:
        others = sorted({str(rivals[slot]) for slot in taken})
        parts.append(f"{len(taken)} target objects are copies made by CopyRule "
                     f"{', '.join(others)}, which copies a source of the same name there "
                     f"(left unchanged): {_first(taken)}. Narrow one of the rules (its "
                     "selector or targetNamespaces) so that only one copies each")
    return "; ".join(parts) + "."


def _first(slots: list[str]) -> str:
    return ", ".join(slots[:5]) + (" ..." if len(slots) > 5 else "")


def _rival(kind: str, slot: str, rule: Obj, reads: Reads) -> str | None:
    """The other CopyRule whose copy is at ``slot``, if it is one: its name as the copy's
    annotation holds it (the label's may be shortened)."""
    namespace, _, name = slot.rpartition("/")
    there = reads.get(("v1", kind), name, namespace or None)
    meta = (there or {}).get("metadata") or {}
    other = (meta.get("labels") or {}).get(RULE_LABEL)
    if there is not None and is_copy(there) and other and other != rule_label_value(rule):
        return str((meta.get("annotations") or {}).get(RULE_ANNOTATION) or other)
    return None


def _conflict_message(kind: str, slot: str, rule: str, reads: Reads, rule_obj: Obj) -> str:
    """What is at the copy's name, and the way out: another rule's copy is not to be
    deleted (its rule would make it again, the two taking turns), but one rule narrowed
    (the condition says the same for all of them, :func:`_conflicts_message`)."""
    other = _rival(kind, slot, rule_obj, reads)
    if other is not None:
        return (f"{kind} {slot} is a copy made by CopyRule {other}, which copies a source of "
                f"that name there too: left unchanged. Narrow one of the two rules (its "
                "selector or targetNamespaces) so that only one copies it there.")
    return (f"{kind} {slot} exists and is not managed by CopyRule {rule}: left unchanged. "
            "Delete or rename it to let the rule create its copy there.")


def _notes(rule: Obj, kind: str, outcome: Outcome, reads: Reads) -> Iterable[Note]:
    """A Warning per conflict not in the status yet (a few, then one summary): posted with
    the status change that lists it, so a lasting conflict does not post one per resync."""
    known = set((rule.get("status") or {}).get("conflictList") or [])
    newly = sorted({str(c) for c in outcome.conflicts} - known)
    name = rule["metadata"]["name"]
    notes = [Note("Warning", "CopyConflict", _conflict_message(kind, slot, name, reads, rule))
             for slot in newly[:MAX_WARNING_EVENTS]]
    if len(newly) > MAX_WARNING_EVENTS:
        notes.append(Note("Warning", "CopyConflict",
                          f"{len(newly) - MAX_WARNING_EVENTS} more {kind}s exist at target "
                          "names and are not managed by this rule; see status.conflictList."))
    if outcome.deleted:
        # Deleting a source, unlabelling it or narrowing the targets removes copies from
        # every namespace at once: a Pod starting there meanwhile misses its pull Secret.
        sources = set(source_namespaces(rule))
        for deleted_kind in sorted({str(o.get("kind")) for o in outcome.deleted}):
            gone = sorted(f"{o['metadata'].get('namespace')}/{o['metadata']['name']}"
                          for o in outcome.deleted if o.get("kind") == deleted_kind)
            in_sources = sorted({o["metadata"].get("namespace") for o in outcome.deleted
                                 if o.get("kind") == deleted_kind} & sources)
            why = ("the rule's ruleType changed" if deleted_kind != kind else
                   "their source is gone or no longer selected, or their namespace is no "
                   "longer a target"
                   + (f"; {', '.join(in_sources)} is a source namespace of this rule, and a "
                      "source namespace gets no copies" if in_sources else ""))
            # every run's: outcome.deleted holds this run's own deletes (those that found the
            # copy gone, another replica's, are outcome.gone), and that replica may have
            # written the status already: a note rides on a status change unless every run's
            notes.append(Note("Normal", "CopiesDeleted",
                              f"deleted {len(gone)} {deleted_kind}(s) no longer wanted ({why}): "
                              f"{_first(gone)}", every_run=True))
    return notes
