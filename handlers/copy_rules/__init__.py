"""CopyRule: keep ConfigMaps or Secrets copied into namespaces (replaces "Copyrator").

Four handlers, each turning one kind of event into a reconcile of the smallest scope that
event can have changed (see :mod:`eventop.handlers.copy_rules.reconcile`):

* CopyRule added/changed (and every periodic resync): the whole rule, pruning copies that
  no longer match. Deleted: nothing to do; the copies carry ownerReferences to the rule, so
  the garbage collector removes them (and ``--cascade=orphan`` keeps them, as the user asked).
* Namespace added/relabelled: copies created or removed in that namespace only. Terminating:
  nothing (the contents go with it). Deleted: the rules' status is recounted.
* ConfigMap/Secret added/changed/deleted in a source namespace: that source's copies
  everywhere. Anywhere else: that one name in that one namespace, which restores a copy
  edited or deleted by hand and notices an object of ours taken over (a conflict).

The event only says *where to look*: objects, Secret contents above all, are read from the
API server, so a forged or stale event can at most cause one more reconcile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventop.events import ANY_KUBE_CHANGE
from eventop.handlers.copy_rules.desired import (
    API_VERSION,
    KIND,
    RULE_LABEL,
    SpecError,
    is_terminating,
    may_target,
    rule_kind,
    rule_label_value,
    source_namespaces,
)
from eventop.handlers.copy_rules.reconcile import (
    Reads,
    Scope,
    list_rules,
    reconcile,
    refresh_status,
)
from eventop.handlers.events import Event
from eventop.handlers.registry import Registry

#: This package's handlers; :func:`eventop.handlers.load` includes it in the router's.
registry = Registry()

Obj = dict[str, Any]


@registry.on(ANY_KUBE_CHANGE, api_version=API_VERSION, kind=KIND)
def on_copy_rule(event: Event, kube: Any) -> str:
    """Reconcile the whole rule as it is now (the event body may be stale)."""
    ref = event.ref
    if ref is None:
        return "ignored: event names no CopyRule"
    rule = kube.get_or_none(API_VERSION, KIND, ref.name)
    if rule is None:
        return (f"CopyRule {ref.name} is gone: its copies are removed by the garbage "
                "collector through their ownerReferences")
    if rule["metadata"].get("deletionTimestamp"):
        return f"CopyRule {ref.name} is being deleted: leaving its copies to the garbage collector"
    try:
        return reconcile(kube, rule, Scope()).summary()
    except SpecError as exc:  # the user must fix the rule: retrying the event can not help
        return f"CopyRule {ref.name} not applied, invalid spec (see its status): {exc}"


@registry.on(ANY_KUBE_CHANGE, api_version="v1", kind="Namespace")
def on_namespace(event: Event, kube: Any) -> str:
    """A namespace appeared or was relabelled: converge every rule's copies in it alone."""
    ref = event.ref
    if ref is None:
        return "ignored: event names no Namespace"
    reads = Reads(kube)
    namespace = reads.namespace(ref.name)
    if namespace is None:
        # Deleted, with its contents: no copy to write, but the rules' counts changed.
        written = [r["metadata"]["name"] for r in list_rules(kube)
                   if not r["metadata"].get("deletionTimestamp")
                   and _valid(r) and refresh_status(kube, r, reads)]
        return (f"namespace {ref.name} is gone with its copies; status recounted for "
                f"{', '.join(written) or 'no rule'}")
    if is_terminating(namespace):
        return f"namespace {ref.name} is terminating: skipped"
    return _each_rule(kube, list_rules(kube), lambda rule: Scope(namespace=ref.name), reads)


@registry.on(ANY_KUBE_CHANGE, api_version="v1", kind="ConfigMap")
@registry.on(ANY_KUBE_CHANGE, api_version="v1", kind="Secret")
def on_config_object(event: Event, kube: Any) -> str:
    """A ConfigMap/Secret changed: as a possible source, converge its copies everywhere; as a
    possible copy (or an object at a copy's name), converge that one slot."""
    ref = event.ref
    if ref is None or not ref.namespace:
        return "ignored: event names no namespaced object"
    rules = [r for r in list_rules(kube) if _rule_kind_or_none(r) == ref.kind
             and (not _valid(r) or ref.namespace in source_namespaces(r)
                  or may_target(r, ref.namespace))]

    def scope_for(rule: Obj) -> Scope:
        if ref.namespace in source_namespaces(rule):
            return Scope(name=ref.name)
        return Scope(name=ref.name, namespace=ref.namespace)

    # Only a hint (an event body may be stale or forged): at most it causes a recount.
    labels = ((event.object or {}).get("metadata") or {}).get("labels") or {}
    return _each_rule(kube, rules, scope_for, Reads(kube),
                      lambda rule: labels.get(RULE_LABEL) == rule_label_value(rule))


def _valid(rule: Obj) -> bool:
    try:
        rule_kind(rule)
        source_namespaces(rule)
        return True
    except SpecError:
        return False


def _rule_kind_or_none(rule: Obj) -> str | None:
    try:
        return rule_kind(rule)
    except SpecError:
        return None


def _each_rule(kube: Any, rules: list[Obj], scope_for: Callable[[Obj], Scope], reads: Reads,
               was_copy: Callable[[Obj], bool] | None = None) -> str:
    """Reconcile each rule in its scope. A rule with an invalid spec is skipped (its status
    says why; its own events report it), the others still converge; API unavailability
    propagates so the event is redelivered."""
    if not rules:
        return "no CopyRules"
    done = []
    for rule in rules:
        if rule["metadata"].get("deletionTimestamp"):
            continue
        try:
            done.append(reconcile(kube, rule, scope_for(rule), reads,
                                  was_copy=bool(was_copy and was_copy(rule))).summary())
        except SpecError as exc:
            done.append(f"{rule['metadata']['name']}: invalid spec: {exc}")
    return "; ".join(done)
