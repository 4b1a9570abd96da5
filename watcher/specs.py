"""What the watcher watches: resources written ``[group/]version/plural[@namespace][:selector]``.

Examples: ``v1/configmaps``, ``eventop.dev/v1/copyrules``, ``v1/secrets@team-a``,
``apps/v1/statefulsets:app.kubernetes.io/managed-by=eventop``. No namespace means all. A
kind works where the plural is not known: ``example.com/v1/Team`` (found by discovery).

By default the watcher watches what the handlers listen to (:func:`default_resources`):
every kind an ``@on`` names and every kind a controller's parent, owned children or mapping
functions are of, narrowed by a label selector where every handler of the kind declares the
same one. A user's handler module (``EVENTOP_HANDLERS``) adds its kinds without restating
the built-in ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventop.cli import NAMESPACE_RULE
from eventop.kube import Kube
from eventop.kube.reflector import Watched, watch_string
from eventop.kube.resources import Resource, ResourceTable
from eventop.names import is_dns_label

if TYPE_CHECKING:
    from eventop.handlers.registry import Registry



@dataclass(frozen=True)
class ResourceSpec:
    """One resource to watch (see the module docstring for the syntax)."""

    group: str
    version: str
    plural: str  # or a Kind (capitalised), resolved by discovery
    namespace: str | None = None
    label_selector: str | None = None
    #: The API server may not serve it (an add-on's CRD a handler can do without): waited
    #: for quietly instead of reported as an error.
    optional: bool = False

    @classmethod
    def parse(cls, text: str) -> ResourceSpec:
        head, _, selector = text.strip().partition(":")
        head, _, namespace = head.partition("@")
        parts = head.split("/")
        if len(parts) == 3:
            group, version, plural = parts
        elif len(parts) == 2:
            group, version, plural = "", parts[0], parts[1]
        elif len(parts) == 1 and parts[0] and "." not in parts[0]:
            group, version, plural = "", "v1", parts[0]
        else:
            raise ValueError(f"cannot read resource {text!r}: write [group/]version/plural"
                             "[@namespace][:selector], e.g. apps/v1/statefulsets or v1/secrets")
        if not (version and plural):
            raise ValueError(f"resource {text!r} needs a version and a plural")
        if namespace and not is_dns_label(namespace):
            raise ValueError(f"resource {text!r}: {namespace!r} after '@' can not be a "
                             f"namespace (expected {NAMESPACE_RULE})")
        return cls(group, version, plural, namespace or None, selector or None)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return watch_string(self.api_version, self.plural, self.namespace, self.label_selector)

    def resolve(self, kube: Kube) -> Watched:
        """What the reflector watches: the resource found by its plural or kind (the static
        table, else API discovery; NotFound while its CRD is not installed). An optional
        resource is always looked up by discovery: the static table knows it whether or not
        this API server serves it (an add-on's CRD, the snapshot API), and only discovery
        tells, so it is waited for quietly instead of listed into a 404 every few seconds."""
        res = kube.served(self.api_version, self.plural) if self.optional else self.resource(kube)
        return Watched(res, self.namespace, self.label_selector)

    def resource(self, kube: Kube) -> Resource:
        """The resource named by its plural, or by its kind (capitalised, as the watch list
        derived from handlers names kinds the static table does not know): the static
        table, else API discovery. NotFound if the API server does not serve it."""
        if self.plural[:1].isupper():
            return kube.resource(self.api_version, self.plural)
        return kube.resource_by_plural(self.api_version, self.plural)


def parse_resources(text: str) -> list[ResourceSpec]:
    """Resources separated by whitespace or newlines (label selectors contain commas); the
    spaces of a set-based selector (``v1/configmaps:app in (a, b)``: around its operator and
    inside its parentheses) do not separate."""
    return [ResourceSpec.parse(t) for t in _split(text)]


def _split(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0  # parentheses the part so far leaves open
    for token in text.split():
        if parts and (depth > 0 or token in ("in", "notin") or token.startswith("(")):
            parts[-1] += " " + token
        else:
            parts.append(token)
            depth = 0
        depth += token.count("(") - token.count(")")
    return parts


def default_resources(registry: Registry | None = None) -> list[ResourceSpec]:
    """What the handlers listen to (``registry``: default, the router's own composition of
    the built-in handlers and ``EVENTOP_HANDLERS``), as resources to watch."""
    if registry is None:
        from eventop import handlers

        registry = handlers.load()
    table = ResourceTable()
    specs = []
    for kind in registry.watched_kinds():
        known = table.by_kind(kind.api_version, kind.kind)
        group, _, version = kind.api_version.rpartition("/")
        specs.append(ResourceSpec(group, version, known.plural if known else kind.kind, None,
                                  kind.selector, kind.optional))
    return specs
