"""What the watcher watches: resources written ``[group/]version/plural[@namespace][:selector]``.

Examples: ``v1/configmaps``, ``eventop.dev/v1/copyrules``, ``v1/secrets@team-a``,
``apps/v1/statefulsets:app.kubernetes.io/managed-by=eventop``. No namespace means all.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventop.kube import Kube
from eventop.kube.reflector import Watched, watch_string

MANAGED_SELECTOR = "app.kubernetes.io/managed-by=eventop"
DEFAULT_RESOURCES = (
    "eventop.dev/v1/registrymirrors",
    "eventop.dev/v1/copyrules",
    "eventop.dev/v1/exchangerates",
    "v1/namespaces",
    "v1/configmaps",
    "v1/secrets",
    f"apps/v1/statefulsets:{MANAGED_SELECTOR}",
    f"apps/v1/daemonsets:{MANAGED_SELECTOR}",
)


@dataclass(frozen=True)
class ResourceSpec:
    """One resource to watch (see the module docstring for the syntax)."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    label_selector: str | None = None

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
        return cls(group, version, plural, namespace or None, selector or None)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return watch_string(self.api_version, self.plural, self.namespace, self.label_selector)

    def resolve(self, kube: Kube) -> Watched:
        """What the reflector watches: the resource found by its plural (the static table,
        else API discovery; NotFound while its CRD is not installed)."""
        return Watched(kube.resource_by_plural(self.api_version, self.plural), self.namespace,
                       self.label_selector)


def parse_resources(text: str) -> list[ResourceSpec]:
    """Resources separated by whitespace or newlines (label selectors contain commas)."""
    return [ResourceSpec.parse(t) for t in text.split() if t.strip()]
