"""The API server a test runs against: eventop's local one, or a real cluster.

Both offer the same verbs, so a scenario is written once: :meth:`Cluster.put` and
:meth:`Cluster.remove` change the cluster as the outside world would (a user, ``kubectl
apply``), :meth:`Cluster.get`/:meth:`Cluster.list` read it for assertions, and
:attr:`Cluster.env` is what the router and watcher processes need to reach it.

* :class:`LocalCluster`: :class:`eventop.localkube.LocalKube` over HTTP on loopback, fresh
  for each test, with the given CRDs installed. Fast, and checked against recordings of a real
  API server; its controllers (garbage collection, namespace deletion) run inside each write.
* :class:`RealCluster`: the cluster of a kubeconfig (``EVENTOP_TEST_KUBECONFIG`` in the
  pytest plugin); the CRDs are applied and waited for; the world writes with a field manager
  of its own, and its garbage collector works in the background (:meth:`Cluster.wait_for`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from eventop.kube import Kube, KubeError
from eventop.testing.waiting import wait_until

Obj = dict[str, Any]

# What the API server sets; a recorded object written back with them would be refused (a
# stale resourceVersion) or ignored.
SERVER_FIELDS = ("resourceVersion", "managedFields", "creationTimestamp", "generation",
                 "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")


def world_copy(obj: Obj) -> Obj:
    """The object as the outside world would write it: no server-owned metadata."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    for field in SERVER_FIELDS:
        meta.pop(field, None)
    return obj


def load_crds(paths: Iterable[str | Path]) -> list[Obj]:
    """The CustomResourceDefinitions in these YAML files and folders (``*.yaml``, ``*.yml``);
    other documents (a kustomization) are skipped."""
    docs: list[Obj] = []
    for given in paths:
        path = Path(given)
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise FileNotFoundError(f"no CRD file at {path}")
        for file in files:
            docs += [d for d in yaml.safe_load_all(file.read_text())
                     if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
    return docs


class Cluster:
    """The verbs of a test's API server (see the module docstring)."""

    kube: Kube
    env: dict[str, str]
    url: str

    def put(self, obj: Obj) -> Obj:
        """Create or update ``obj`` as the outside world would; returns what is stored."""
        raise NotImplementedError

    def remove(self, api_version: str, kind: str, name: str,
               namespace: str | None = None) -> None:
        """Delete the object (a namespace: it terminates, with its content)."""
        raise NotImplementedError

    def get(self, *what: str | None) -> Obj | None:
        """The object, or None: ``get("apps/v1/Deployment", name, namespace)`` (a kind
        written as the engine writes it) or ``get("apps/v1", "Deployment", name, namespace)``.
        """
        api_version, kind, rest = _kind_of(what)
        name, namespace = (*rest, None)[:2]
        return self.kube.get_or_none(api_version, kind, str(name), namespace)

    def list(self, *what: str | None) -> list[Obj]:
        """Objects of a kind (``"v1/ConfigMap"`` or ``"v1", "ConfigMap"``), in a namespace if
        one follows."""
        api_version, kind, rest = _kind_of(what)
        return list(self.kube.list(api_version, kind, namespace=(*rest, None)[0]))

    def settle(self) -> None:
        """Wait until the API server finished the background work of past writes."""

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 60.0,
                 what: str = "condition") -> Any:
        """Poll ``predicate()`` until truthy; :class:`TimeoutError` naming ``what``."""
        value = wait_until(predicate, timeout, interval=0.1)
        if not value:
            raise TimeoutError(f"{what} not reached within {timeout:g}s")
        return value

    def delete_made(self, timeout: float = 60.0) -> list[str]:
        """Delete what this test put that was not there before (a real cluster outlives the
        test; a local one is thrown away: nothing to do), and wait until it is gone; the
        objects still there after ``timeout``, named."""
        return []

    def close(self) -> None:
        """Stop what this cluster object started."""


def _kind_of(what: tuple[str | None, ...]) -> tuple[str, str, tuple[str | None, ...]]:
    """``("apps/v1/Deployment", ...)`` or ``("apps/v1", "Deployment", ...)``: apiVersion, kind
    and the rest (a kind starts with a capital letter, an apiVersion's last part never does)."""
    first = str(what[0])
    head, _, last = first.rpartition("/")
    if head and last[:1].isupper():
        return head, last, what[1:]
    return first, str(what[1]), what[2:]


class LocalCluster(Cluster):
    """eventop's local API server, with ``crds`` installed (paths of files or folders).

    ``options`` go to :class:`eventop.localkube.LocalKube` (``bookmark_interval=0.1``...);
    or give ``local``, a LocalKube already started, to use that one (whoever started it stops
    it: :meth:`close` leaves it running).
    """

    def __init__(self, crds: Iterable[str | Path] = (), *, local: Any = None,
                 **options: Any) -> None:
        from eventop.localkube import LocalKube

        self._owned = local is None
        # As a real cluster's garbage collector does, objects whose owner is gone are
        # collected: a run that read its parent just before the parent's deletion may
        # still write a child, and a test must not depend on which came first.
        options = {"gc_dangling": True, **options}
        self.local = LocalKube(crd_dir=None, **options) if local is None else local
        self.url = self.local.start() if local is None else self.local.url
        try:
            for crd in load_crds(crds):
                self.local.put(crd)
        except BaseException:
            self.close()
            raise
        self.kube = Kube.connect(url=self.url)
        self.env = {"EVENTOP_KUBE_URL": self.url}

    def put(self, obj: Obj) -> Obj:
        stored: Obj = self.local.put(world_copy(obj))
        return stored

    def remove(self, api_version: str, kind: str, name: str,
               namespace: str | None = None) -> None:
        self.local.remove(api_version, kind, name, namespace)

    def settle(self) -> None:
        self.local.wait_idle()

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for ``kubectl`` (and anything else) to reach this server."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "eventop-local",
            "clusters": [{"name": "eventop-local", "cluster": {"server": self.url}}],
            "users": [{"name": "eventop-local", "user": {}}],
            "contexts": [{"name": "eventop-local",
                          "context": {"cluster": "eventop-local", "user": "eventop-local"}}],
        }, sort_keys=False))
        return path

    def close(self) -> None:
        if self._owned:
            self.local.stop()


class RealCluster(Cluster):
    """The cluster of ``kubeconfig``: ``crds`` are applied and waited for (Established)."""

    FIELD_MANAGER = "eventop-tests-world"

    def __init__(self, kubeconfig: str, crds: Iterable[str | Path] = ()) -> None:
        self.kube = Kube.connect(kubeconfig=kubeconfig)
        self.world = self.kube.for_manager(self.FIELD_MANAGER)
        self.url = self.kube.host
        self.env = {"KUBECONFIG": kubeconfig}
        #: What :meth:`put` created, in order: :meth:`delete_made` removes it.
        self._made: list[tuple[str, str, str, str | None]] = []
        self.install_crds(crds)

    def install_crds(self, crds: Iterable[str | Path]) -> None:
        """Apply CustomResourceDefinitions (files or folders) and wait until each is
        Established and its kind can be listed (served, discovery included)."""
        for crd in load_crds(crds):
            self.world.apply(crd, force=True)
            name = crd["metadata"]["name"]
            self.wait_for(lambda name=name: self._established(name), 60,
                          f"CustomResourceDefinition {name} Established")
            spec = crd["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served", True))
            api_version, kind = f"{spec['group']}/{version}", spec["names"]["kind"]
            self.wait_for(lambda a=api_version, k=kind: self._lists(a, k), 60, f"{kind} served")

    def _lists(self, api_version: str, kind: str) -> bool:
        try:
            self.world.list(api_version, kind)
            return True
        except Exception:  # not served yet: discovery or the list itself fails
            return False

    def _established(self, name: str) -> bool:
        crd = self.kube.get_or_none("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in ((crd or {}).get("status") or {}).get("conditions") or [])

    def put(self, obj: Obj) -> Obj:
        body = world_copy(obj)
        body["metadata"].pop("uid", None)
        body.pop("status", None)
        slot = (str(body["apiVersion"]), str(body["kind"]), str(body["metadata"]["name"]),
                body["metadata"].get("namespace"))
        if slot not in self._made and self.world.get_or_none(*slot) is None:
            self._made.append(slot)  # not someone's object the test only changed
        return self.world.apply(body, force=True)

    def delete_made(self, timeout: float = 60.0) -> list[str]:
        made, self._made = self._made[::-1], []
        for slot in made:  # newest first: a namespace after what the test put in it
            with contextlib.suppress(KubeError):
                self.world.delete(*slot)

        def left() -> list[tuple[str, str, str, str | None]]:
            return [s for s in made if self.world.get_or_none(*s) is not None]

        wait_until(lambda: not left(), timeout, interval=0.2)
        return [f"{kind} {f'{ns}/' if ns else ''}{name}" for _, kind, name, ns in left()]

    def remove(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               timeout: float = 120.0) -> None:
        self._made = [s for s in self._made if s != (api_version, kind, name, namespace)]
        if not self.world.delete(api_version, kind, name, namespace):
            return
        self.wait_for(lambda: self.world.get_or_none(api_version, kind, name, namespace) is None,
                      timeout, f"{kind} {namespace or ''}/{name} gone")
