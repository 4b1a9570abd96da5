"""Count what actually changed in the cluster: the side effects, as the API server records them.

A write that changes nothing (a server-side apply of what is already there) is not stored
and sends no watch event; a write that changes something bumps the object's
resourceVersion and every watcher sees it. So an independent watch, counting ADDED,
MODIFIED and DELETED per resource for the workload's namespaces, counts side effects
exactly: a duplicate side effect is a modification no change of the workload justified.

The observer connects straight to the API server (not through the fault proxy). Across an
API server restart it lists again and counts each object whose resourceVersion moved as
one modification (several in the gap would count as one: an undercount only while the API
server itself is down, when nobody can write).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from typing import Any

from eventop.kube import Kube

MANAGED = "app.kubernetes.io/managed-by=eventop"


class Observer:
    def __init__(self, kube: Kube, namespace_prefix: str,
                 kinds: tuple[str, ...] = ("ConfigMap", "Secret")) -> None:
        self.kube = kube
        self.prefix = namespace_prefix
        self.counts: Counter[str] = Counter()
        self._versions: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = [threading.Event() for _ in kinds]
        for kind, synced in zip(kinds, self._synced, strict=True):
            threading.Thread(target=self._run, args=(kind, synced), daemon=True,
                             name=f"observer {kind}").start()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        return all(e.wait(timeout) for e in self._synced)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def close(self) -> None:
        self._stop.set()

    # -- the watch loop ----------------------------------------------------------------------

    def _mine(self, obj: dict[str, Any]) -> bool:
        return str(obj["metadata"].get("namespace", "")).startswith(self.prefix)

    def _run(self, kind: str, synced: threading.Event) -> None:
        res = self.kube.resource("v1", kind)
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist(kind, bool(synced.is_set()))
                    synced.set()
                query = [("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                         ("timeoutSeconds", 30), ("labelSelector", MANAGED)]
                for line in self.kube.iter_watch(res, None, query, (5.0, 40.0)):
                    if self._stop.is_set():
                        return
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK" and self._mine(obj):
                        self._record(kind, obj, event["type"] == "DELETED")
            except Exception:  # the API server going away: list again when it is back
                rv = ""
                self._stop.wait(0.5)

    def _record(self, kind: str, obj: dict[str, Any], deleted: bool) -> None:
        meta = obj["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        with self._lock:
            self.counts[kind] += 1
            if deleted:
                self._versions.pop(key, None)
            else:
                self._versions[key] = meta["resourceVersion"]

    def _relist(self, kind: str, count: bool) -> str:
        items: list[dict[str, Any]] = []
        rv = ""
        for page in self.kube.pages(self.kube.resource("v1", kind), label_selector=MANAGED):
            items += page["items"]
            rv = str(page["metadata"].get("resourceVersion") or rv)
        seen = set()
        with self._lock:
            for obj in items:
                if not self._mine(obj):
                    continue
                meta = obj["metadata"]
                key = (kind, meta["namespace"], meta["name"])
                seen.add(key)
                if count and self._versions.get(key) != meta["resourceVersion"]:
                    self.counts[kind] += 1
                self._versions[key] = meta["resourceVersion"]
            for key in [k for k in self._versions if k[0] == kind and k not in seen]:
                if count:
                    self.counts[kind] += 1
                with contextlib.suppress(KeyError):
                    del self._versions[key]
        return rv
