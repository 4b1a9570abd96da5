"""Namespace -> copy latency on a real API server: eventop next to kopf and Kubernetes' own Go
controller, measured on the same burst of namespaces in the same run.

Three copiers act on each new namespace of the burst:

* eventop (watcher -> router under gunicorn -> the CopyRule handler on the reconcile engine),
  copying a labelled ConfigMap into namespaces labelled ``eventop-bench=<run>``;
* the kopf peer (``../shared/peers/kopf_copy.py``, kopf 1.45.2 in a virtualenv of its own),
  copying into namespaces labelled ``bar-target=<prefix>``;
* kube-controller-manager's root-CA publisher (Go, informers and a workqueue), which puts
  ``kube-root-ca.crt`` into every namespace.

One watch of all ConfigMaps, opened before the burst, notes when each copy first appears;
each namespace's clock starts when its create request is sent. Prints p50/p90 per copier for
each burst (three by default, one after the other: the Go publisher's own p50 swings several
fold from one burst to the next on a loaded machine) and the median over the bursts of the
ratios against the Go publisher and kopf, then, counted from the router's ``/metrics``:
the API requests eventop made per new namespace; the requests the echoes of its own writes
cost (a source change: its writes, then nothing more); and a resync with nothing changed
(every object's update event again: no write, no read). Asserts nothing.

    .venv/bin/python bench/copy_latency.py [--kubeconfig PATH] [--namespaces 60]
        [--peers ../shared/peers] [--workers 1] [--bursts 3]

Without ``--kubeconfig`` (or ``KUBECONFIG``) it starts a throwaway cluster with
``../shared/k8s/cluster`` and stops it afterwards; without the peers directory it measures
eventop and the Go publisher only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from bench.world import (  # noqa: E402
    QUIET,
    SHARED,
    Sightings,
    connect,
    diff,
    kube_requests,
    metric,
    on_cluster,
    remove,
)
from eventop.events import to_cloudevent, to_http  # noqa: E402
from eventop.testing.processes import RouterProcess, WatcherProcess  # noqa: E402

KOPF = "kopf==1.45.2"
Obj = dict[str, Any]


def kopf_python(cache: Path) -> Path:
    """kopf 1.45.2 in a virtualenv of its own (made once, kept under ``cache``)."""
    venv = cache / "kopf-1.45.2"
    python = venv / "bin" / "python"
    if not (venv / "ok").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", KOPF, "kubernetes==37.0.2"],
                       check=True)
        (venv / "ok").write_text(KOPF)
    return python


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def run(kubeconfig: str, count: int, peers: Path | None, workers: int, bursts: int) -> None:
    admin = connect(kubeconfig)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"lat{run_id}"
    ev_src, kopf_src = f"{prefix}-ev-src", f"{prefix}-src"
    target_labels = {"eventop-bench": run_id, "bar-target": prefix}
    made: list[str] = []

    def namespace(name: str, labels: Obj | None = None) -> None:
        admin.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": name, "labels": labels or {}}})
        made.append(name)

    namespace(ev_src)
    namespace(kopf_src)
    admin.create({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "ev-copy", "namespace": ev_src,
                               "labels": {"eventop-bench": "source"}},
                  "data": {"who": "eventop"}})
    admin.create({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "kopf-copy", "namespace": kopf_src,
                               "labels": {"bar": prefix}}, "data": {"who": "kopf"}})
    rule = f"{prefix}-rule"
    admin.create({"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": rule},
                  "spec": {"ruleType": "configmap", "namespaces": [ev_src],
                           "selector": {"matchLabels": {"eventop-bench": "source"}},
                           "targetNamespaces": {"selector": {
                               "matchLabels": {"eventop-bench": run_id}}}}})
    log_dir = tempfile.mkdtemp(prefix="eventop-latency-")
    env = {"KUBECONFIG": kubeconfig, **QUIET}
    router = RouterProcess(env, workers=workers, log_dir=log_dir)
    watcher = WatcherProcess(router.url, env, log_dir=log_dir)
    kopf = None
    if peers is not None:
        python = kopf_python(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                             / "eventop-bench")
        kopf = subprocess.Popen(
            [str(python.parent / "kopf"), "run", "--standalone", "-A", "--quiet",
             str(peers / "kopf_copy.py")],
            env={**os.environ, "PREFIX": prefix, "KUBECONFIG": kubeconfig,
                 "PYTHONWARNINGS": "ignore"},
            stdout=subprocess.DEVNULL, stderr=open(Path(log_dir) / "kopf.log", "wb"))  # noqa: SIM115
    seen = Sightings(admin, "v1", "ConfigMap")  # when each ConfigMap first appeared
    copiers = {"eventop": "ev-copy", "Go root-CA publisher": "kube-root-ca.crt"}
    if kopf is not None:
        copiers["kopf 1.45.2"] = "kopf-copy"

    def burst(index: int, names: list[str]) -> tuple[dict[str, float], float]:
        """One burst of ``names``: prints each copier's p50/p90 and eventop's API
        requests; returns the p50s and the requests per new namespace."""
        before = kube_requests(router.url)
        sent: dict[str, float] = {}

        def create(name: str) -> None:
            sent[name] = time.monotonic()
            namespace(name, target_labels)

        with ThreadPoolExecutor(8) as pool:  # the burst
            list(pool.map(create, names))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                seen.at(ns, n) for ns in names for n in copiers.values()):
            time.sleep(0.1)
        time.sleep(3.0)  # the echoes of eventop's writes come back meanwhile
        spent = diff(kube_requests(router.url), before)
        print(f"  burst {index + 1}:")
        p50s = {}
        for copier, name in copiers.items():
            latencies = [(at - sent[ns]) * 1000 for ns in names
                         if (at := seen.at(ns, name)) is not None]
            p50s[copier] = percentile(latencies, 0.5)
            print(f"    {copier:22s} p50 {p50s[copier]:7.1f} ms   p90 "
                  f"{percentile(latencies, 0.9):7.1f} ms   ({len(latencies)}/{count} "
                  "copies)")
        if os.environ.get("EVENTOP_BENCH_VERBOSE"):
            t0 = min(sent.values())
            for ns in sorted(names, key=lambda n: sent[n]):
                print(f"      {ns}: sent +{(sent[ns] - t0) * 1000:6.0f} ms, " + ", ".join(
                    f"{c.split()[0]} "
                    f"+{((seen.at(ns, n) or float('nan')) - sent[ns]) * 1000:5.0f}"
                    for c, n in copiers.items()))
        total = sum(spent.values())
        print(f"    router API requests: {total} {dict(sorted(spent.items()))}: "
              f"{total / count:.2f} per new namespace (target <= 2)")
        return p50s, total / count

    try:
        seen.wait_synced(30)
        # Warm up: every copier has acted once (caches synced, connections open).
        warm = f"{prefix}-warm"
        namespace(warm, target_labels)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                seen.at(warm, name) for name in copiers.values()):
            time.sleep(0.1)
        missing = [c for c, n in copiers.items() if not seen.at(warm, n)]
        if missing:
            raise SystemExit(f"copy_latency: no copy by {', '.join(missing)} within 120 s; logs "
                             f"in {log_dir}")
        time.sleep(2.0)
        print(f"namespace -> copy, {count} namespaces created in a burst (8 at a time), "
              f"{bursts} burst(s), real API server {admin.host}, router workers: {workers}")
        ratios: dict[str, list[float]] = {"Go publisher": [], "kopf": []}
        requests_per_ns: list[float] = []
        for b in range(bursts):
            names = [f"{prefix}-b{b}-n{i:03d}" for i in range(count)]
            p50s, per_ns = burst(b, names)
            requests_per_ns.append(per_ns)
            ratios["Go publisher"].append(p50s["eventop"] / p50s["Go root-CA publisher"])
            if "kopf 1.45.2" in p50s:
                ratios["kopf"].append(p50s["eventop"] / p50s["kopf 1.45.2"])
            time.sleep(2.0)
        targets = {"Go publisher": 1.5, "kopf": 0.25}
        for peer, values in ratios.items():
            if values:
                print(f"  eventop p50 / {peer} p50: median {statistics.median(values):.2f} "
                      f"over {len(values)} burst(s) ({', '.join(f'{v:.2f}' for v in values)}; "
                      f"target <= {targets[peer]})")
        print(f"  router API requests per new namespace: at most {max(requests_per_ns):.2f} in "
              "a burst (target <= 2)")

        # A source change: its writes, then the echoes of those writes come back.
        before = kube_requests(router.url)
        echoes0 = metric(router.url, "eventop_engine_requests_total", result="echo")
        admin.replace({**admin.get("v1", "ConfigMap", "ev-copy", ev_src), "data": {"who": "v2"}})
        time.sleep(5.0)
        change = diff(kube_requests(router.url), before)
        echoes = metric(router.url, "eventop_engine_requests_total", result="echo") - echoes0
        writes = sum(v for k, v in change.items() if k in ("create", "update", "apply", "patch",
                                                            "delete"))
        print(f"  a source change: {writes} writes ({bursts * count + 1} copies), "
              f"{sum(change.values()) - writes} other requests; {echoes:.0f} echoes of those "
              "writes came back and cost no request")

        # A resync with nothing changed: every object's update event, posted again.
        before = kube_requests(router.url)
        runs0 = metric(router.url, "eventop_engine_runs_total")
        objects = [admin.get("eventop.dev/v1", "CopyRule", rule)]
        objects += [o for o in admin.list("v1", "Namespace")]
        objects += [o for o in admin.list("v1", "ConfigMap") if o["metadata"]["namespace"]
                    .startswith(prefix)]
        with requests.Session() as session:
            for obj in objects:
                headers, body = to_http(to_cloudevent("update", obj, admin.host))
                session.post(router.url, data=body, headers=headers, timeout=60)
        resync = diff(kube_requests(router.url), before)
        runs = metric(router.url, "eventop_engine_runs_total") - runs0
        print(f"  a resync with nothing changed: {len(objects)} update events, {runs:.0f} runs, "
              f"{sum(resync.values())} API requests {dict(resync)} (target 0 writes, no reads)")
    finally:
        seen.stop()
        if kopf is not None:
            kopf.terminate()
            kopf.wait(15)
        keep = bool(os.environ.get("EVENTOP_BENCH_KEEP_LOGS"))
        watcher.stop(keep_log=keep)
        router.stop(keep_log=keep)
        if keep:
            print(f"  logs: {router.log_path} {watcher.log_path}")
        remove(admin, rule, made)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--namespaces", type=int, default=60)
    parser.add_argument("--peers", type=Path, default=SHARED / "peers")
    parser.add_argument("--workers", type=int, default=1, help="router worker processes")
    parser.add_argument("--bursts", type=int, default=3,
                        help="bursts of --namespaces each, one after the other; the ratios "
                             "are the median over the bursts")
    args = parser.parse_args()
    peers = args.peers if (args.peers / "kopf_copy.py").exists() else None
    if peers is None:
        print(f"copy_latency: no kopf peer at {args.peers}: measuring eventop and the Go "
              "publisher only")
    on_cluster(args.kubeconfig, "copy_latency",
               lambda kubeconfig: run(kubeconfig, args.namespaces, peers, args.workers,
                                         args.bursts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
