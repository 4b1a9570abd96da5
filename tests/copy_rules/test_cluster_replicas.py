"""Two router workers (deploy/'s two replicas: each its own caches and engine, the Lease
holder's watch starting runs too) and the watcher, on a real API server, under bursts of
changes to the sources of one CopyRule: a copy only ever moves forward through its source's
versions (``pytest -m cluster``, ``EVENTOP_TEST_KUBECONFIG``).

A reviewer saw copies go back to older data for a moment (``v=2, 4, 2, 4``) in 7 of 8 such
bursts: a write that lost its precondition race was sent again with what its run had worked
out from an older source."""

from __future__ import annotations

import itertools
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
TARGETS = 8
ROUNDS = 3
SOURCES = ("settings", "flags")


class Seen:
    """Every version of this run's ConfigMaps, in the API server's order, from a watch of
    all ConfigMaps opened before the bursts."""

    def __init__(self, kube: Any, namespaces: set[str]) -> None:
        self.kube, self.namespaces = kube, namespaces
        self.versions: list[tuple[int, str, str, str]] = []  # rv, namespace, name, value
        self.stop = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        res = self.kube.resource("v1", "ConfigMap")
        rv = self.kube.request("GET", "/api/v1/configmaps", verb="list",
                               query=[("limit", "1")])["metadata"]["resourceVersion"]
        self.ready.set()
        while not self.stop.is_set():
            for line in self.kube.iter_watch(res, None, [("resourceVersion", rv),
                                                         ("timeoutSeconds", 30)], (5, 40)):
                event = json.loads(line)
                meta = event["object"]["metadata"]
                rv = meta["resourceVersion"]
                if event["type"] != "DELETED" and meta.get("namespace") in self.namespaces \
                        and meta["name"] in SOURCES:
                    self.versions.append((int(rv), meta["namespace"], meta["name"],
                                          (event["object"].get("data") or {}).get("v", "")))
                if self.stop.is_set():
                    return

    def values(self, namespace: str, name: str, since: int) -> list[str]:
        return [v for rv, ns, n, v in sorted(self.versions[since:]) if (ns, n) == (namespace, name)]


def test_two_workers_in_bursts_of_source_changes_never_put_a_copy_back_to_older_data(
        tmp_path: Path) -> None:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    from eventop.testing import Pipeline, RealCluster

    cluster = RealCluster(kubeconfig)
    cluster.install_crds([REPO / "crds" / "copyrules.yaml"])
    kube = cluster.kube
    run = uuid.uuid4().hex[:6]
    src = f"eventop-burst-{run}-src"
    targets = [f"eventop-burst-{run}-{i}" for i in range(TARGETS)]
    label = {"eventop.dev/test-run": run}
    rule = f"eventop-burst-{run}"
    seen = Seen(kube, {src, *targets})
    try:
        assert seen.ready.wait(30)
        cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": src}})
        for ns in targets:
            cluster.put({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": ns, "labels": label}})
        for name in SOURCES:
            cluster.put({"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": "start"},
                         "metadata": {"name": name, "namespace": src,
                                      "labels": {"copyrator": "true"}}})
        cluster.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": rule},
                     "spec": {"ruleType": "configmap", "namespaces": [src],
                              "selector": {"matchLabels": {"copyrator": "true"}},
                              "targetNamespaces": {"selector": {"matchLabels": label}}}})
        with Pipeline(cluster, builtin="copy_rules", watcher=True, workers=2,
                      env={"EVENTOP_RUN_ON_WATCH": "leader"}, log_dir=str(tmp_path)):
            def converged(value: dict[str, str]) -> bool:
                return all((kube.get_or_none("v1", "ConfigMap", name, ns) or {}).get(
                    "data", {}).get("v") == value[name] for ns in targets for name in SOURCES)

            cluster.wait_for(lambda: converged({n: "start" for n in SOURCES}), 60,
                             "the first copies")
            backwards = []
            for round_ in range(ROUNDS):
                since = len(seen.versions)
                writers = [threading.Thread(target=kube.patch, args=(
                    "v1", "ConfigMap", name, src, {"data": {"v": f"{round_}-{i}"}}))
                    for i in range(8) for name in SOURCES]
                for t in writers:
                    t.start()
                for t in writers:
                    t.join()
                last = {name: kube.get("v1", "ConfigMap", name, src)["data"]["v"]
                        for name in SOURCES}
                cluster.wait_for(lambda: converged(last), 60,  # noqa: B023
                                 f"round {round_}: every copy at its source's last value")
                for name in SOURCES:
                    order = {v: i for i, v in enumerate(seen.values(src, name, since))}
                    for ns in targets:
                        ranks = [order[v] for v in seen.values(ns, name, since) if v in order]
                        if any(b < a for a, b in itertools.pairwise(ranks)):
                            backwards.append((round_, ns, name, seen.values(ns, name, since)))
            assert backwards == [], f"copies went back to older source data: {backwards}"
    finally:
        seen.stop.set()
        cluster.remove("eventop.dev/v1", "CopyRule", rule)
        for ns in (src, *targets):
            cluster.remove("v1", "Namespace", ns)
