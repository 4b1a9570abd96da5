"""Naming kinds and parents: ``Kind("v1/ConfigMap")``, ``Key(namespace, name)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """A kind a handler declares, written ``"<apiVersion>/<Kind>"``: ``"v1/ConfigMap"``,
    ``"apps/v1/StatefulSet"``, ``"eventop.dev/v1/CopyRule"``.

    ``metadata_only``: the cache keeps only ``metadata`` (labels, owners, deletion) of these
    objects, asked from the API server as PartialObjectMetadata, which costs a fraction of
    the memory and traffic of whole objects (Namespaces for a copy rule's targets).
    ``selector``: the cache keeps only objects with these labels (a label selector in the API's
    syntax), for kinds far more numerous than the ones the handler cares about.
    ``optional``: the API server may not serve this kind (an add-on's CRD, such as
    VolumeSnapshot); the handler asks ``reads.served(kind)`` and readiness does not wait for it.
    """

    api_version: str
    kind: str = ""  # empty: api_version is the whole "<apiVersion>/<Kind>"
    metadata_only: bool = False
    selector: str | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        if not self.kind:
            api_version, _, kind = self.api_version.rpartition("/")
            object.__setattr__(self, "api_version", api_version)
            object.__setattr__(self, "kind", kind)
        if not self.api_version or not self.kind[:1].isupper():
            raise ValueError(f"cannot read kind {self.api_version}/{self.kind!s}: write "
                             "<apiVersion>/<Kind>, e.g. v1/ConfigMap, apps/v1/StatefulSet or "
                             "eventop.dev/v1/CopyRule")

    @classmethod
    def of(cls, spec: str | Kind | tuple[str, str], **options: Any) -> Kind:
        if isinstance(spec, Kind):
            return cls(spec.api_version, spec.kind, **{
                "metadata_only": spec.metadata_only, "selector": spec.selector,
                "optional": spec.optional, **options})
        if isinstance(spec, tuple):
            return cls(spec[0], spec[1], **options)
        return cls(str(spec), **options)

    @property
    def key(self) -> tuple[str, str]:
        return (self.api_version, self.kind)

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"

    def is_kind_of(self, obj: Obj) -> bool:
        return obj.get("apiVersion") == self.api_version and obj.get("kind") == self.kind


class Key(NamedTuple):
    """Which parent object a piece of work is about. ``namespace`` is "" when cluster-scoped."""

    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Obj) -> Key:
        meta = obj.get("metadata") or {}
        return cls(meta.get("namespace") or "", str(meta["name"]))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def merge_kinds(kinds: list[Kind]) -> dict[tuple[str, str], Kind]:
    """One Kind per (apiVersion, kind), as wide as every declaration of it needs: whole
    objects if anyone needs more than metadata; no selector unless all agree on one."""
    merged: dict[tuple[str, str], Kind] = {}
    for k in kinds:
        have = merged.get(k.key)
        if have is None:
            merged[k.key] = k
            continue
        merged[k.key] = Kind(k.api_version, k.kind,
                             metadata_only=have.metadata_only and k.metadata_only,
                             selector=have.selector if have.selector == k.selector else None,
                             optional=have.optional and k.optional)
    return merged
