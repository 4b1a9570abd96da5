"""Router memory with its caches over 1,000 namespaces and 10,000 ConfigMaps, per process.

On a real API server it makes a world of N namespaces (1,000) holding M ConfigMaps in all
(10,000, counting the ``kube-root-ca.crt`` Kubernetes puts in each; the rest small and
realistic: a few keys, labels, an annotation) and a CopyRule copying one ConfigMap into
every one of them. Then, for each process model asked (``--workers 1,2``: gunicorn workers,
``--threads`` threads each), it starts the router with the default handlers, waits
for ``/readyz`` (every cache listed and watching) and for the rule's copies, lets it
settle, and prints the RSS of every gunicorn process (master and workers), their sum, and
the API requests the router made to get there (from its ``/metrics``: each worker lists
and watches every kind itself). Target: under 150 MB per process. Asserts nothing.

    .venv/bin/python bench/router_memory.py [--kubeconfig PATH] [--namespaces 1000]
        [--configmaps 10000] [--workers 1,2] [--threads 32] [--keep]

Without ``--kubeconfig`` (or ``KUBECONFIG``) it starts a throwaway cluster with
``../shared/k8s/cluster`` (skipped when that is not present). ``--keep`` leaves the world
in place for another run (found again by its label).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from bench.world import (  # noqa: E402
    QUIET,
    connect,
    diff,
    kube_requests,
    on_cluster,
    process_tree,
    remove,
    wait_root_ca,
)
from eventop.kube import Kube  # noqa: E402
from eventop.testing.processes import RouterProcess  # noqa: E402

LABEL = "eventop-router-memory"
MB = 1024 * 1024
COPY_LABEL = "eventop.dev/copy-rule"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def make_world(kube: Kube, namespaces: int, configmaps: int) -> tuple[list[str], str]:
    """The namespaces (reused when a previous ``--keep`` run left them) and the source."""
    names = [f"mem-{i:04d}" for i in range(namespaces)]
    existing = {n["metadata"]["name"] for n in kube.list("v1", "Namespace")}
    src = "mem-src"
    per_ns = max(0, (configmaps - namespaces) // namespaces - 1)  # root CA + copy + these

    def namespace(name: str) -> None:
        if name not in existing:
            kube.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": name, "labels": {LABEL: "target"}}})
        have = {c["metadata"]["name"] for c in kube.list("v1", "ConfigMap", name)}
        for j in range(per_ns):
            if f"settings-{j}" not in have:
                kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                    "name": f"settings-{j}", "namespace": name,
                    "labels": {"app.kubernetes.io/name": "bench", "tier": f"t{j % 3}"},
                    "annotations": {"bench.eventop.dev/note": "filler for router_memory"}},
                    "data": {"LOG_LEVEL": "info", "FEATURE_X": "true",
                             "ENDPOINT": f"https://svc-{j}.{name}.svc:8443/api"}})

    start = time.monotonic()
    if src not in existing:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": src}})
        kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "copied", "namespace": src, "labels": {LABEL: "src"}},
                     "data": {"v": "1"}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(namespace, names))
    if not kube.list("eventop.dev/v1", "CopyRule", field_selector="metadata.name=mem-rule"):
        kube.create({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                     "metadata": {"name": "mem-rule"},
                     "spec": {"ruleType": "configmap", "namespaces": [src],
                              "selector": {"matchLabels": {LABEL: "src"}},
                              "targetNamespaces": {"selector": {
                                  "matchLabels": {LABEL: "target"}}}}})
    print(f"  world ready in {time.monotonic() - start:.0f} s: {namespaces} namespaces, "
          f"{per_ns} filler ConfigMaps each (+ kube-root-ca.crt + the copy)")
    return names, src


def count_copies(configmaps: list[dict[str, Any]]) -> int:
    """Counted in a list of every ConfigMap: a selector-limited paginated list on the
    v1.24 test API server stopped after its first page (500) here."""
    return sum(1 for c in configmaps
               if (c["metadata"].get("labels") or {}).get(COPY_LABEL) == "mem-rule")


def measure(kubeconfig: str, workers: int, threads: int, expected: int) -> None:
    env = {"KUBECONFIG": kubeconfig, **{k: v for k, v in QUIET.items()
                                        if k != "EVENTOP_BUILTIN_HANDLERS"}}
    kube = Kube.connect(kubeconfig=kubeconfig)
    start = time.monotonic()
    router = RouterProcess(env, workers=workers, extra_args=["--threads", str(threads)])
    try:
        while time.monotonic() - start < 300:
            try:
                if requests.get(router.url + "/readyz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        ready = time.monotonic() - start
        while (count_copies(kube.list("v1", "ConfigMap")) < expected
               and time.monotonic() - start < 600):
            time.sleep(2.0)
        time.sleep(10.0)  # echoes, status, garbage
        spent = diff(kube_requests(router.url), {})
        pids = process_tree(router.proc.pid)
        sizes = {pid: rss(pid) for pid in pids}
        configmaps = kube.list("v1", "ConfigMap")
        copies = count_copies(configmaps)
        print(f"  {workers} worker(s) x {threads} threads: ready (caches synced) in {ready:.1f} s;"
              f" {copies}/{expected} copies; the cache holds {len(configmaps)} ConfigMaps")
        for pid, size in sizes.items():
            role = "master" if pid == router.proc.pid else "worker"
            print(f"    {role:6s} pid {pid}: RSS {size / MB:6.1f} MB (target < 150 MB)")
        print(f"    all processes: {sum(sizes.values()) / MB:.1f} MB; API requests so far "
              f"{dict(sorted(spent.items()))} ({sum(spent.values())} in all)")
    finally:
        router.stop()


def run(kubeconfig: str, namespaces: int, configmaps: int, models: list[int],
        threads: int, keep: bool) -> None:
    kube = connect(kubeconfig)
    print(f"router memory, real API server {kube.host} (load: {os.getloadavg()[0]:.2f})")
    names, src = make_world(kube, namespaces, configmaps)
    waited = wait_root_ca(kube, [src, *names])
    print(f"  (waited {waited:.0f} s for the root-CA publisher's kube-root-ca.crt in each)")
    total = len(kube.list("v1", "ConfigMap"))
    print(f"  the cluster holds {len(kube.list('v1', 'Namespace'))} namespaces, "
          f"{total} ConfigMaps, {len(kube.list('v1', 'Secret'))} Secrets")
    try:
        for workers in models:
            measure(kubeconfig, workers, threads, len(names))
    finally:
        if not keep:
            remove(kube, "mem-rule", [src, *names])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--configmaps", type=int, default=10000)
    parser.add_argument("--workers", default="1,2",
                        help="gunicorn worker counts to measure, comma-separated")
    parser.add_argument("--threads", type=int, default=32, help="threads per worker")
    parser.add_argument("--keep", action="store_true", help="leave the world in place")
    args = parser.parse_args()
    models = [int(w) for w in args.workers.split(",")]
    on_cluster(args.kubeconfig, "router_memory", lambda kubeconfig: run(
        kubeconfig, args.namespaces, args.configmaps, models, args.threads, args.keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
