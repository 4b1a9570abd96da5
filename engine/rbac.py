"""The RBAC rules a registry's handlers need, worked out from what they declare.

What the engine does with each declared kind decides the verbs (docs/ENGINE.md, and the
README's "Ship it"):

* the parent: ``list watch`` (the router's cache), ``patch`` on ``<plural>/status``,
  ``update`` on ``<plural>/finalizers`` (children carry ``blockOwnerDeletion``, which the
  OwnerReferencesPermissionEnforcement admission plugin checks that way) and, with a
  ``finalize`` function, ``patch`` on the parent itself (its finalizer);
* each owned kind: ``list watch`` (cached), ``create``, ``patch`` (server-side apply),
  ``delete`` (children no longer desired) and ``get`` (a create answered 409 reads what is
  there); a ``Child(mode="replace")`` needs ``update`` too, which is not declared (the
  printed role says so);
* each kind only read (``reads=``, ``@maps``): ``list watch``;
* Events: ``get create patch`` (a repeat bumps its count).

The watcher needs ``list watch`` on every kind a handler listens to. An event function
(``@on``) writes whatever its code writes: that is not declared, so it is named, not derived.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventop.kube.resources import Resource, ResourceTable

if TYPE_CHECKING:
    from eventop.handlers.registry import Registry

#: (apiVersion, kind) -> (group, plural); raises LookupError for a kind it does not know.
Plurals = Callable[[str, str], tuple[str, str]]

VERB_ORDER = ("get", "list", "watch", "create", "patch", "update", "delete")
CACHED = ("list", "watch")
CHILD = ("get", "list", "watch", "create", "patch", "delete")
EVENTS = ("get", "create", "patch")
EMPTY_GROUP = '""'  # the core group, as YAML must spell it


@dataclass
class Role:
    """Rules as ``(group, resource) -> verbs``, each with why it is there."""

    rules: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    why: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def grant(self, group: str, resource: str, verbs: tuple[str, ...], why: str) -> None:
        self.rules.setdefault((group, resource), set()).update(verbs)
        reasons = self.why.setdefault((group, resource), [])
        if why not in reasons:
            reasons.append(why)

    def to_yaml(self, name: str) -> str:
        lines = ["apiVersion: rbac.authorization.k8s.io/v1", "kind: ClusterRole",
                 "metadata:", f"  name: {name}", "rules:"]
        for (group, resource), verbs in sorted(self.rules.items()):
            lines.append(f"  # {'; '.join(self.why[(group, resource)])}")
            lines += [f"  - apiGroups: [{group or EMPTY_GROUP}]", f"    resources: [{resource}]",
                      f"    verbs: [{', '.join(v for v in VERB_ORDER if v in verbs)}]"]
        return "\n".join(lines) + "\n"


def router_role(registry: Registry, plurals: Plurals) -> Role:
    """What the router's ServiceAccount needs for the registry's controllers."""
    role = Role()
    for ctl in registry.controllers:
        group, plural = plurals(ctl.parent.api_version, ctl.parent.kind)
        role.grant(group, plural, CACHED, f"{ctl.name}: its parents, cached")
        role.grant(group, f"{plural}/status", ("patch",), f"{ctl.name}: the parents' status")
        role.grant(group, f"{plural}/finalizers", ("update",),
                   f"{ctl.name}: children's blockOwnerDeletion")
        if ctl.finalizer:
            role.grant(group, plural, ("patch",), f"{ctl.name}: its finalizer")
        owned = {k.key for k in ctl.owns}
        for kind in ctl.kinds():
            if kind.key == ctl.parent.key:
                continue
            group, plural = plurals(*kind.key)
            if kind.key in owned:
                role.grant(group, plural, CHILD, f"{ctl.name}: its children, cached")
            else:
                role.grant(group, plural, CACHED, f"{ctl.name}: read, cached")
        role.grant("", "events", EVENTS, f"{ctl.name}: Events on its parents")
    return role


def watcher_role(registry: Registry, plurals: Plurals,
                 verbs: tuple[str, ...] = CACHED) -> Role:
    """What the event source needs on every kind a handler listens to: the watcher lists
    and watches; Knative's ApiServerSource also checks ``get`` before it starts."""
    role = Role()
    for kind in registry.watched_kinds():
        group, plural = plurals(kind.api_version, kind.kind)
        role.grant(group, plural, verbs, "a handler listens to it")
    return role


def event_functions(registry: Registry) -> list[str]:
    """The event functions, whose writes are their code's: the reader adds their grants."""
    return [reg.name for reg in registry.registrations]


def plurals_from(crds: list[dict[str, Any]], discover: Plurals | None = None) -> Plurals:
    """Plurals from the built-in table, then these CustomResourceDefinitions, then
    ``discover`` (an API server's discovery) if given."""
    table = ResourceTable()
    for crd in crds:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for version in spec.get("versions") or ():
            table.add(Resource(str(spec.get("group")), str(version.get("name")),
                               str(names.get("kind")), str(names.get("plural")),
                               spec.get("scope") != "Cluster"))

    def plural(api_version: str, kind: str) -> tuple[str, str]:
        known = table.by_kind(api_version, kind)
        if known is not None:
            return known.group, known.plural
        if discover is not None:
            return discover(api_version, kind)
        raise LookupError(f"{api_version}/{kind}", "")

    return plural

