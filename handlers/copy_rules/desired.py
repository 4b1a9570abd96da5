"""What a CopyRule asks for, as pure functions over plain dicts (no I/O, easy to test).

The controller (:mod:`.controller`) reads sources, namespaces and existing objects from the
router's cache and asks these functions what the cluster should hold; the engine writes
only the difference.

Ownership rule (who may eventop touch?), the one Kubernetes controllers use for their
dependents (ControllerRefManager):

* an object is a copy *managed by a rule* if it carries an ownerReference to that very
  CopyRule (same uid). That reference is also what makes the garbage collector delete the copy
  with the rule, so "managed by the rule" and "deleted with the rule" are the same set;
* an *orphan* at a slot the rule wants, i.e. an object with no controller ownerReference at
  all that names this rule in both its ``eventop.dev/copy-rule`` label and annotation, is
  adopted (its ownerReference added, its content restored). That is how copies left by
  ``kubectl delete copyrule --cascade=orphan``, or a copy whose ownerReference was stripped,
  come back under the rule when it is applied again;
* anything else is not ours and is never written or deleted. A bare
  ``app.kubernetes.io/managed-by=eventop`` label proves nothing (anyone who can edit ConfigMaps
  in a namespace can write it, and other tools set it too): the recorded hand-made
  ``team-a/registry-config`` carries only that label, so it is reported as a conflict and left
  alone. Adoption needs the rule's own label and annotation, never happens outside the rule's
  targets and never deletes: the most a forged label can do is receive the copy that namespace
  is entitled to anyway. To take a copy over for good, remove its ``eventop.dev/copy-rule``
  label (and the ownerReference).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from eventop.engine import SpecError
from eventop.kube import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    content_hash,
    is_owned_by,
    is_terminating,
    label_selector_problems,
    label_value,
    owner_reference,
    selector_matches,
)

Obj = dict[str, Any]

GROUP = "eventop.dev"
API_VERSION = "eventop.dev/v1"
KIND = "CopyRule"

RULE_LABEL = "eventop.dev/copy-rule"
SOURCE_NS_LABEL = "eventop.dev/source-namespace"
RULE_ANNOTATION = "eventop.dev/copy-rule"
SOURCE_ANNOTATION = "eventop.dev/source"
HASH_ANNOTATION = "eventop.dev/content-hash"

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
#: The ConfigMap Kubernetes' root-CA publisher keeps in every namespace: never a source (its
#: name is taken everywhere, so a copy could only conflict, in every target namespace).
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
KIND_BY_RULE_TYPE = {"configmap": "ConfigMap", "secret": "Secret"}
PAYLOAD_FIELDS = ("data", "binaryData", "type", "immutable")

def rule_kind(rule: Obj) -> str:
    """``ConfigMap`` or ``Secret`` for a rule's ``spec.ruleType``."""
    rule_type = ((rule.get("spec") or {}).get("ruleType") or "").lower()
    try:
        return KIND_BY_RULE_TYPE[rule_type]
    except KeyError:
        raise SpecError(f"spec.ruleType must be 'configmap' or 'secret', got {rule_type!r}") \
            from None


def source_namespaces(rule: Obj) -> list[str]:
    """Source namespaces in spec order, without duplicates (earlier ones win name clashes)."""
    seen: dict[str, None] = {}
    for ns in (rule.get("spec") or {}).get("namespaces") or []:
        seen.setdefault(str(ns), None)
    if not seen:
        raise SpecError("spec.namespaces must name at least one source namespace")
    return list(seen)


def rule_selector(rule: Obj) -> Obj:
    return dict((rule.get("spec") or {}).get("selector") or {})


def validate_selector(selector: Obj, field: str) -> None:
    """Refuse a LabelSelector the API server's parser would refuse (the CRD schema lets
    ``In`` with no values or a key no label can have through): a selector matching nothing
    by accident must say so."""
    problems = label_selector_problems(selector)
    if problems:
        raise SpecError(f"{field}: {'; '.join(problems)}")


def rule_label_value(rule: Obj) -> str:
    return label_value(rule["metadata"]["name"])


def copies_selector(rule: Obj) -> str:
    """Label selector listing every copy of a rule in one request (all namespaces)."""
    return f"{RULE_LABEL}={rule_label_value(rule)}"


def owned_by(obj: Obj, rule: Obj) -> bool:
    """The ownership rule (module docstring): an ownerReference to this rule's uid."""
    uid = (rule.get("metadata") or {}).get("uid")
    return bool(uid) and is_owned_by(obj, uid)


def adoptable(obj: Obj, rule: Obj) -> bool:
    """An orphan naming this rule in label and annotation (module docstring)."""
    meta = obj.get("metadata") or {}
    if any(ref.get("controller") for ref in meta.get("ownerReferences") or []):
        return False
    name = (rule.get("metadata") or {}).get("name", "")
    return ((meta.get("labels") or {}).get(RULE_LABEL) == label_value(name)
            and (meta.get("annotations") or {}).get(RULE_ANNOTATION) == name)


def is_copy(obj: Obj) -> bool:
    """Any CopyRule's copy (owned by one, or an orphan marked as one): never itself a source,
    so copies are never copied again (no chains or loops between rules)."""
    meta = obj.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    if any(ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/")
           for ref in refs):
        return True
    return RULE_LABEL in (meta.get("labels") or {}) and \
        RULE_ANNOTATION in (meta.get("annotations") or {})


def is_source(rule: Obj, obj: Obj) -> bool:
    """Does ``obj`` (a ConfigMap or Secret as read from the API server) feed this rule?"""
    meta = obj.get("metadata") or {}
    if obj.get("kind") != rule_kind(rule) or meta.get("namespace") not in source_namespaces(rule):
        return False
    if meta.get("deletionTimestamp") or is_copy(obj):
        return False
    if obj.get("kind") == "Secret" and obj.get("type") == SA_TOKEN_TYPE:
        return False  # a token is bound to its ServiceAccount: copying it leaks credentials
    if obj.get("kind") == "ConfigMap" and meta.get("name") == ROOT_CA_CONFIGMAP:
        return False  # a rule with no selector matches it: not a conflict in every namespace
    try:
        return selector_matches(rule_selector(rule), meta.get("labels"))
    except ValueError as exc:
        raise SpecError(f"spec.selector: {exc}") from None


def is_target(rule: Obj, namespace: Obj) -> bool:
    """Is this namespace a target of the rule (for sources in other namespaces)?

    Default: every Active namespace except the system ones. ``targetNamespaces.names`` and
    ``targetNamespaces.selector`` narrow that: a namespace is a target if it is named, or
    matches the selector (either suffices when both are given). System namespaces are
    targets only when named explicitly. Terminating namespaces never are.

    An empty ``names`` list narrows like any other: it names no namespace. Read as "not
    given" it would widen a rule to the whole cluster, and a template that rendered an empty
    list would copy a Secret into every namespace (the CRD refuses ``names: []`` too; this
    holds for objects stored before it did).
    """
    meta = namespace.get("metadata") or {}
    name = meta.get("name")
    if not name or is_terminating(namespace):
        return False
    targets = (rule.get("spec") or {}).get("targetNamespaces") or {}
    names = targets.get("names")
    selector = targets.get("selector")
    if names and name in names:
        return True
    if name in SYSTEM_NAMESPACES:
        return False
    if selector is not None:
        try:
            return selector_matches(selector, meta.get("labels"))
        except ValueError as exc:
            raise SpecError(f"spec.targetNamespaces.selector: {exc}") from None
    return names is None


def may_target(rule: Obj, namespace_name: str) -> bool:
    """False when the namespace can not be a target whatever its labels: lets the handlers
    ignore the chatter of kube-system ConfigMaps (leader election, every few seconds) without
    a single read."""
    targets = (rule.get("spec") or {}).get("targetNamespaces") or {}
    names = targets.get("names")
    if names and namespace_name in names:
        return True
    if namespace_name in SYSTEM_NAMESPACES:
        return False
    return names is None or targets.get("selector") is not None


def payload(obj: Obj) -> Obj:
    """The copied content: data, binaryData, type, immutable (absent/empty fields omitted)."""
    out: Obj = {}
    for field in PAYLOAD_FIELDS:
        value = obj.get(field)
        if value in (None, {}, ""):
            continue
        if field == "immutable" and value is False:
            continue
        if field == "type" and value == "Opaque":
            continue  # the API server's default: a copy without type reads back as Opaque
        out[field] = value
    return out


def source_hash(source: Obj) -> str:
    """Hash of a source's payload; written on each copy so humans (and `kubectl get -L`)
    can see which version of the source a copy holds."""
    return content_hash(payload(source))


def source_key(source: Obj) -> str:
    meta = source["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def desired_copy(rule: Obj, source: Obj, namespace: str) -> Obj:
    """The copy of ``source`` in ``namespace`` exactly as eventop server-side applies it.

    Only the payload travels: the source's labels, annotations, ownerReferences and all
    server-managed metadata stay behind (a copy carrying the source's labels could match a
    selector and be copied again).
    """
    meta = source["metadata"]
    rule_name = rule["metadata"]["name"]
    obj: Obj = {
        "apiVersion": "v1",
        "kind": source["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                RULE_LABEL: label_value(rule_name),
                SOURCE_NS_LABEL: meta["namespace"],
            },
            "annotations": {
                RULE_ANNOTATION: rule_name,
                SOURCE_ANNOTATION: source_key(source),
                HASH_ANNOTATION: source_hash(source),
            },
            "ownerReferences": [owner_reference(rule)],
        },
    }
    obj.update(payload(source))
    return obj


def managed_view(obj: Obj) -> Obj:
    """What eventop sets on a copy, read back from any object: compare two of these to know
    whether a write is needed. Computed from the object's actual content, never trusting
    its hash annotation (a hand edit keeps the annotation but changes the data)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return {
        "payload": payload(obj),
        "labels": {k: labels.get(k) for k in (MANAGED_BY_LABEL, RULE_LABEL, SOURCE_NS_LABEL)},
        "annotations": {k: annotations.get(k)
                        for k in (RULE_ANNOTATION, SOURCE_ANNOTATION, HASH_ANNOTATION)},
        "owners": sorted(str(r.get("uid")) for r in meta.get("ownerReferences") or []
                         if r.get("kind") == KIND),
    }


def in_sync(existing: Obj, desired: Obj) -> bool:
    return managed_view(existing) == managed_view(desired)


def needs_recreate(existing: Obj, desired: Obj) -> bool:
    """An immutable copy, or a Secret whose type changed, can only be replaced by delete+create."""
    if payload(existing) == payload(desired):
        return False
    if existing.get("immutable"):
        return True
    return existing.get("kind") == "Secret" and \
        (existing.get("type") or "Opaque") != (desired.get("type") or "Opaque")


def winning_sources(rule: Obj, sources: Iterable[Obj]) -> dict[str, Obj]:
    """Sources by name. Two source namespaces holding the same name would fight over one
    target slot: the namespace listed first in ``spec.namespaces`` wins, deterministically,
    so every replica and every run picks the same one."""
    order = {ns: i for i, ns in enumerate(source_namespaces(rule))}
    best: dict[str, Obj] = {}
    for src in sources:
        meta = src["metadata"]
        current = best.get(meta["name"])
        if current is None or order[meta["namespace"]] < order[current["metadata"]["namespace"]]:
            best[meta["name"]] = src
    return best


@dataclass(frozen=True)
class Slot:
    """Where one copy lives: (namespace, name)."""
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def desired_copies(rule: Obj, sources: Iterable[Obj],
                   namespaces: Iterable[Obj]) -> dict[Slot, Obj]:
    """Every copy the rule asks for, given its sources and candidate target namespaces.

    No copy goes into a source namespace of the rule: each publishes there, and a copy of
    another's would stand in the way of its own source of that name (created again, it
    would be refused as existing, or overwritten as a copy) and be reported as a conflict
    where it has one.

    Each source's copy is built (and its content hashed) once; the copies differ only in
    their namespace and share the rest, read-only."""
    publishers = set(source_namespaces(rule))
    targets = [ns["metadata"]["name"] for ns in namespaces
               if ns["metadata"].get("name") not in publishers and is_target(rule, ns)]
    result: dict[Slot, Obj] = {}
    for name, src in sorted(winning_sources(rule, sources).items()):
        src_ns = src["metadata"]["namespace"]
        template = desired_copy(rule, src, src_ns)
        for target in targets:
            if target != src_ns:
                result[Slot(target, name)] = {
                    **template, "metadata": {**template["metadata"], "namespace": target}}
    return result
