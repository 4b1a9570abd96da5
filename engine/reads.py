"""What a handler's function reads: the router's cache, limited to the kinds it declared.

Every read is answered from memory (no API request): the cache is kept by list+watch and
is at least as new as the event that started the run (see ``docs/ENGINE.md``, "Stale
caches"). A handler reading a kind it did not declare gets :class:`UndeclaredKind` naming
it, instead of a silent empty answer: an undeclared kind would be neither cached, nor
watched, nor granted by RBAC.

Objects are the cache's own: read-only. Build new dicts for children (``{**obj, ...}``
copies the top level), never change what a read returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from eventop.engine.kinds import Kind
from eventop.kube.store import Store

Obj = dict[str, Any]
KindSpec = str | Kind | tuple[str, str]
StoreFor = Callable[[str, str], "Store | None"]


class UndeclaredKind(LookupError):
    """A handler read a kind it did not declare."""


class NotCached(LookupError):
    """The kind is declared but its cache is not available (its CRD is not installed)."""


class Reads:
    """Cached reads for one run of one handler; ``parent`` is the object being reconciled."""

    def __init__(self, stores: StoreFor, declared: Iterable[Kind], handler: str,
                 parent: Obj | None = None) -> None:
        self._stores = stores
        self._declared = {k.key: k for k in declared}
        self._handler = handler
        self.parent = parent

    def _store(self, kind: KindSpec) -> Store:
        k = Kind.of(kind)
        if k.key not in self._declared:
            raise UndeclaredKind(
                f"handler {self._handler!r} read {k}, which it did not declare: add "
                f"{str(k)!r} to its reads=[...] (or owns=[...]) so that the router caches "
                "and watches it and RBAC grants it")
        store = self._stores(k.api_version, k.kind)
        if store is None:
            raise NotCached(f"{k} is not cached (is its CustomResourceDefinition installed?)")
        return store

    def get(self, kind: KindSpec, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None."""
        return self._store(kind).get(namespace, name)

    def list(self, kind: KindSpec, namespace: str | None = None, *, name: str | None = None,
             labels: dict[str, str] | None = None, selector: Obj | None = None,
             owner: str | None = None) -> list[Obj]:
        """Objects of a kind, filtered: in ``namespace`` (None: all), named ``name`` (across
        namespaces), carrying ``labels``, matching a metav1.LabelSelector ``selector``, or
        controlled by the owner of uid ``owner``. Sorted by namespace and name."""
        return self._store(kind).list(namespace, name=name, owner=owner, labels=labels,
                                      selector=selector)

    def children(self, kind: KindSpec) -> list[Obj]:
        """The parent's children of a kind: objects whose controller ownerReference is the
        parent."""
        if self.parent is None:
            raise LookupError("children() needs a parent: this read is not part of a run")
        return self.list(kind, owner=str(self.parent["metadata"]["uid"]))

    def served(self, kind: KindSpec) -> bool:
        """Whether the API server serves this declared kind (its cache exists): for kinds
        declared ``optional``, such as an add-on's CRD."""
        k = Kind.of(kind)
        if k.key not in self._declared:
            self._store(k)  # raises UndeclaredKind
        return self._stores(k.api_version, k.kind) is not None

    def namespaced(self, kind: KindSpec) -> bool | None:
        """Whether objects of this declared kind live in namespaces, as the API server
        serves it; None where that is not known (a test world's kind it holds no object of)."""
        return self._store(kind).namespaced

    def metadata_only(self, kind: KindSpec) -> bool:
        """Whether the cache holds only the metadata of this kind's objects."""
        return self._declared[Kind.of(kind).key].metadata_only
