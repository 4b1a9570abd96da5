"""The whole pipeline for tests: an API server, the router under gunicorn, CloudEvents on the wire.

``LocalPipeline`` runs against :class:`eventop.localkube.LocalKube`; ``ClusterPipeline`` against the
real cluster of ``EVENTOP_TEST_KUBECONFIG``. Both offer the same verbs, so a scenario can be
written once: ``world_put``/``world_remove`` change the cluster as the outside world would,
``post`` sends the CloudEvent the watcher would send for an object, ``replay`` does both for a
recording in resourceVersion order.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import requests
from cloudevents.core.v1.event import CloudEvent

from eventop.events import simple_event, to_cloudevent, to_http
from eventop.kube import Kube
from eventop.testing.cluster import world_copy
from eventop.watcher.recording import load_initial, load_recording
from tests.support.processes import RouterProcess
from tests.support.waiting import wait_until

Obj = dict[str, Any]
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
T = TypeVar("T")


def _recording_paths(what: str | Path | list[str | Path]) -> list[Path]:
    items = what if isinstance(what, list) else [what]
    paths = []
    for item in items:
        p = Path(item)
        paths.append(p if p.is_absolute() or p.exists() else RECORDINGS / p)
    return paths


def replay_recording(what: str | Path | list[str | Path], *, put: Callable[[Obj], Any],
                     remove: Callable[[str, str, str, str | None], Any],
                     deliver: Callable[[str, Obj], T], settle: Callable[[], Any] = lambda: None,
                     after_each: Callable[[str, Obj], None] | None = None) -> list[T]:
    """Seed a recording's listed state, then replay its watch events in resourceVersion order.

    For each event the cluster is first changed as it was when recorded (``put``; ``remove``
    for a deletion or a namespace turning Terminating), then ``deliver(change, obj)`` hands
    eventop the event a watch of *this* API server would carry: the object as ``put``
    stored it (its resourceVersion, which a router's cache is compared with, is this
    server's, not the recording's); for a removal, the recorded object without a
    resourceVersion (the router then asks the API server how far it is). ``after_each(change,
    obj)``, if given, runs with the recorded object after each watch event once ``settle()``
    returned (the API server finished its background work): the place for assertions about
    the states in between. Returns what ``deliver`` returned, in order.
    """
    paths = _recording_paths(what)
    answers = []
    for obj in load_initial(paths):
        answers.append(deliver("add", _as_served(put(obj), obj)))
    for change, obj in load_recording(paths):
        meta = obj["metadata"]
        if change == "delete":
            remove(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
            sent = _unversioned(obj)
        elif obj["kind"] == "Namespace" and meta.get("deletionTimestamp"):
            remove("v1", "Namespace", meta["name"], None)
            sent = _unversioned(obj)
        else:
            sent = _as_served(put(obj), obj)
        answers.append(deliver(change, sent))
        if after_each is not None:
            settle()
            after_each(change, obj)
    settle()
    return answers


def _as_served(stored: Any, recorded: Obj) -> Obj:
    return stored if isinstance(stored, dict) and stored.get("metadata") else recorded


def _unversioned(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    return out


class _Pipeline:
    kube: Kube
    router: RouterProcess
    source = "https://127.0.0.1:6443"

    @property
    def router_url(self) -> str:
        return self.router.url

    def world_put(self, obj: Obj) -> Obj:
        raise NotImplementedError

    def world_remove(self, api_version: str, kind: str, name: str,
                     namespace: str | None = None) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Wait until the API server finished background work (GC, namespace deletion)."""

    def post(self, change: str, obj: Obj) -> int:
        """Post the Resource-mode CloudEvent the watcher sends for this change of ``obj``."""
        return self._send(to_cloudevent(change, obj, self.source))

    def post_event(self, type_: str, data: Any = None) -> int:
        """Post any other event (a refresh, a ping), as ``python -m eventop.watcher emit`` does."""
        return self._send(simple_event(type_, "/tests", data, f"test-{time.monotonic_ns()}"))

    def _send(self, event: CloudEvent) -> int:
        headers, body = to_http(event)
        return requests.post(self.router.url, data=body, headers=headers, timeout=60).status_code

    def replay(self, what: str | Path | list[str | Path],
               after_each: Callable[[str, Obj], None] | None = None) -> list[int]:
        """:func:`replay_recording` through the router: returns the router's answers."""
        return replay_recording(what, put=self.world_put, remove=self.world_remove,
                                deliver=self.post, settle=self.settle, after_each=after_each)

    def close(self) -> None:
        self.router.stop()


class LocalPipeline(_Pipeline):
    def __init__(self, local_kube: Any, env: dict[str, str] | None = None) -> None:
        self.local_kube = local_kube
        self.kube = Kube.connect(url=local_kube.url)
        self.router = RouterProcess({"EVENTOP_KUBE_URL": local_kube.url, **(env or {})})

    def world_put(self, obj: Obj) -> Obj:
        stored: Obj = self.local_kube.put(world_copy(obj))
        return stored

    def world_remove(self, api_version: str, kind: str, name: str,
                     namespace: str | None = None) -> None:
        self.local_kube.remove(api_version, kind, name, namespace)

    def settle(self) -> None:
        self.local_kube.wait_idle()


class ClusterPipeline(_Pipeline):
    """Against a real cluster: the world writes with its own field manager."""

    def __init__(self, kubeconfig: str, env: dict[str, str] | None = None) -> None:
        self.kube = Kube.connect(kubeconfig=kubeconfig)
        self.world = Kube.connect(kubeconfig=kubeconfig)
        self.world.field_manager = "eventop-tests-world"
        self.source = self.kube.host
        self.router = RouterProcess({"KUBECONFIG": kubeconfig, **(env or {})})

    def world_put(self, obj: Obj) -> Obj:
        body = world_copy(obj)
        body["metadata"].pop("uid", None)
        body.pop("status", None)
        return self.world.apply(body, force=True)

    def world_remove(self, api_version: str, kind: str, name: str,
                     namespace: str | None = None, timeout: float = 120.0) -> None:
        self.world.delete(api_version, kind, name, namespace)
        self.wait_for(lambda: self.world.get_or_none(api_version, kind, name, namespace) is None,
                      timeout, f"{kind} {namespace}/{name} gone")

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 60.0,
                 what: str = "condition") -> Any:
        """Poll ``predicate()`` until truthy: a real cluster's GC and controllers are async."""
        value = wait_until(predicate, timeout, interval=0.5)
        if not value:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        return value
