"""Sustained load through the whole pipeline on a real API server: watcher -> router -> handlers.

For a fixed time, the "world" changes source ConfigMaps of a CopyRule at a steady rate (each
change carries an increasing sequence number); eventop copies each into every target
namespace. An observer watch records when each copy first shows a sequence number at least
that of each change. Prints:

* changes/s made and CloudEvents/s the watcher delivered;
* end-to-end latency p50/p99: from the world's write of a change to the last of its copies
  showing it (a later change that overtook it counts: level-triggered handlers may skip an
  intermediate value, never the last one);
* Kubernetes API requests the router made per event it handled;
* peak RSS of the watcher, the gunicorn master and its largest worker;
* lost changes: copies not showing the final value of their source when the run ends
  (target: zero).

Asserts nothing (benchmarks print; tests assert).

    .venv/bin/python bench/pipeline_load.py [--kubeconfig PATH] [--seconds 30] [--rate 20]

Without ``--kubeconfig`` (or ``EVENTOP_TEST_KUBECONFIG``) it starts a throwaway cluster with
``../shared/k8s/cluster`` and stops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.world import install_crds, process_tree, remove  # noqa: E402
from eventop.kube import Kube  # noqa: E402
from eventop.testing.processes import (  # noqa: E402
    RouterProcess,
    WatcherProcess,
    free_port,
    metric_samples,
    wait_http,
)

CLUSTER = REPO.parent / "shared" / "k8s" / "cluster"
QUIET = {"PYTHONWARNINGS": "ignore:Unverified HTTPS request", "EVENTOP_LOG_LEVEL": "WARNING"}
warnings.filterwarnings("ignore", message="Unverified HTTPS request")


def metric_sum(url: str, name: str) -> float:
    return sum(value for _labels, value in metric_samples(url, name))


def peak_rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else 0.0


class CopyObserver:
    """Watches the copies; remembers when each target first showed each sequence number."""

    def __init__(self, kube: Kube, prefix: str) -> None:
        self.kube, self.prefix = kube, prefix
        self.first_seen: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.latest: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        res = self.kube.resource("v1", "ConfigMap")
        rv = ""
        for page in self.kube.pages(res, label_selector="app.kubernetes.io/managed-by=eventop"):
            rv = str(page["metadata"].get("resourceVersion") or rv)
        self.ready.set()
        while not self._stop.is_set():
            try:
                query = [("resourceVersion", rv), ("timeoutSeconds", 30),
                         ("labelSelector", "app.kubernetes.io/managed-by=eventop")]
                for line in self.kube.iter_watch(res, None, query, (5.0, 40.0)):
                    event = json.loads(line)
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    ns = obj["metadata"].get("namespace", "")
                    if event["type"] == "ERROR" or not ns.startswith(self.prefix):
                        continue
                    seq = int((obj.get("data") or {}).get("seq", "-1"))
                    key = (ns, obj["metadata"]["name"])
                    if seq > self.latest.get(key, -1):
                        self.latest[key] = seq
                        self.first_seen.setdefault(key, []).append((seq, time.monotonic()))
            except Exception:
                time.sleep(0.5)

    def reached(self, key: tuple[str, str], seq: int) -> float | None:
        for s, at in self.first_seen.get(key, []):
            if s >= seq:
                return at
        return None

    def stop(self) -> None:
        self._stop.set()


def run(kubeconfig: str, seconds: float, rate: float, sources: int, targets: int) -> None:
    world = Kube.connect(kubeconfig=kubeconfig)
    world.field_manager = "bench-world"
    install_crds(world)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"load-{run_id}-"
    src, label = f"{prefix}src", {"eventop.dev/load-run": run_id}
    target_ns = [f"{prefix}t{i}" for i in range(targets)]
    names = [f"source-{i}" for i in range(sources)]
    world.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": src}})
    for ns in target_ns:
        world.apply({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": ns, "labels": label}})

    def source(name: str, seq: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": src, "labels": {"load": "true"}},
                "data": {"seq": str(seq)}}

    for name in names:
        world.apply(source(name, 0))
    rule = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
            "metadata": {"name": f"load-{run_id}"},
            "spec": {"ruleType": "configmap", "namespaces": [src],
                     "selector": {"matchLabels": {"load": "true"}},
                     "targetNamespaces": {"selector": {"matchLabels": label}}}}
    world.apply(rule)
    observer = CopyObserver(world, prefix)
    observer.ready.wait(30)
    log_dir = tempfile.mkdtemp(prefix="eventop-load-")
    router = RouterProcess({"KUBECONFIG": kubeconfig, **QUIET}, log_dir=log_dir)
    metrics_port = free_port()
    watcher = WatcherProcess(router.url, {"KUBECONFIG": kubeconfig, **QUIET,
                                          "EVENTOP_METRICS_PORT": str(metrics_port)},
                             log_dir=log_dir)
    watcher_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    peaks = {"watcher": 0.0, "router master": 0.0, "router worker (largest)": 0.0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            peaks["watcher"] = max(peaks["watcher"], peak_rss_mb(watcher.proc.pid))
            peaks["router master"] = max(peaks["router master"], peak_rss_mb(router.proc.pid))
            for child in process_tree(router.proc.pid)[1:]:
                peaks["router worker (largest)"] = max(peaks["router worker (largest)"],
                                                       peak_rss_mb(child))
    threading.Thread(target=sample, daemon=True).start()
    try:
        # settle: every target has every source's copy before the clock starts
        while not all(observer.reached((ns, n), 0) for ns in target_ns for n in names):
            time.sleep(0.2)
        # The router copies from its own watch, so the copies can be in place before the
        # watcher (which loads the handlers first) serves its metrics.
        wait_http(watcher_metrics, 60, watcher.proc)
        delivered0 = metric_sum(watcher_metrics, "eventop_watcher_events_delivered_total")
        requests0 = metric_sum(router.url + "/metrics", "eventop_kube_requests_total")
        handled0 = metric_sum(router.url + "/metrics", "eventop_events_total")
        writes: list[tuple[str, int, float]] = []
        start = time.monotonic()
        seq = 0
        while time.monotonic() - start < seconds:
            seq += 1
            name = names[seq % len(names)]
            at = time.monotonic()
            world.apply(source(name, seq))
            writes.append((name, seq, at))
            time.sleep(max(0.0, start + seq / rate - time.monotonic()))
        elapsed = time.monotonic() - start
        final = {name: max(s for n, s, _ in writes if n == name) for name in names
                 if any(n == name for n, _, _ in writes)}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                observer.reached((ns, n), s) for ns in target_ns for n, s in final.items()):
            time.sleep(0.2)
        lost = sum(observer.reached((ns, n), s) is None
                   for ns in target_ns for n, s in final.items())
        latencies = []
        for name, s, at in writes:
            seen = [observer.reached((ns, name), s) for ns in target_ns]
            if all(t is not None for t in seen):
                latencies.append(max(seen) - at)  # type: ignore[type-var]
        time.sleep(1.0)
        delivered = metric_sum(watcher_metrics, "eventop_watcher_events_delivered_total") \
            - delivered0
        api = metric_sum(router.url + "/metrics", "eventop_kube_requests_total") - requests0
        handled = metric_sum(router.url + "/metrics", "eventop_events_total") - handled0
    finally:
        sampling.set()
        observer.stop()
        watcher.stop()
        router.stop()
        remove(world, f"load-{run_id}", [src, *target_ns])
    latencies.sort()

    def pct(p: float) -> str:
        if not latencies:
            return "n/a"
        return f"{latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000:.0f} ms"

    print(f"pipeline load: {len(writes)} source changes in {elapsed:.1f} s "
          f"({len(writes) / elapsed:.1f} changes/s), {sources} sources x {targets} targets")
    print(f"  watcher delivered {delivered:.0f} CloudEvents ({delivered / elapsed:.1f} events/s); "
          f"router handled {handled:.0f}")
    print(f"  end-to-end latency, change to last copy written: p50 {pct(0.50)}, "
          f"p99 {pct(0.99)} (over {len(latencies)} changes)")
    print(f"  Kubernetes API requests per handled event: {api / max(handled, 1):.2f}")
    print("  peak RSS: " + ", ".join(f"{k} {v:.0f} MB" for k, v in peaks.items()))
    print(f"  lost changes: {lost} (copies not at their source's final value after 60 s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("EVENTOP_TEST_KUBECONFIG"))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="source changes per second")
    parser.add_argument("--sources", type=int, default=5)
    parser.add_argument("--targets", type=int, default=5)
    args = parser.parse_args()
    if args.kubeconfig:
        run(args.kubeconfig, args.seconds, args.rate, args.sources, args.targets)
        return 0
    if not CLUSTER.exists():  # `make bench` on a machine without the shared cluster
        print(f"pipeline load: skipped, no cluster (pass --kubeconfig, or have "
              f"../shared/k8s/cluster at {CLUSTER})")
        return 0
    state = tempfile.mkdtemp(prefix="eventop-load-cluster-")
    try:
        out = subprocess.run([str(CLUSTER), "start", state], check=True, capture_output=True,
                             text=True)
        run(out.stdout.strip().splitlines()[-1], args.seconds, args.rate, args.sources,
            args.targets)
    finally:
        subprocess.run([str(CLUSTER), "stop", state], check=False, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
