"""Fan-out: one source change reaches 1,000 namespaces, through the whole pipeline.

A CopyRule copies one ConfigMap into N namespaces (1,000 by default); once every copy is in
place, the source is changed and the clock runs until the last copy holds the new data,
seen by a watch of the copies. Printed: that time, and the router's API requests while it
ran (from its ``/metrics``): the writes (target: exactly one per copy) and anything else.
Then a resync with nothing changed (the rule's and the source's update events again): its
writes and reads (target: none). Asserts nothing.

    .venv/bin/python bench/copy_fanout.py [--kubeconfig PATH] [--namespaces 1000]

On the real API server named by ``--kubeconfig`` (or ``KUBECONFIG``), or one started from
``../shared/k8s/cluster`` when that is present; else on the local API server (localkube).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from bench.world import (  # noqa: E402
    CLUSTER,
    QUIET,
    CpuMeter,
    Sightings,
    by_label,
    connect,
    control_plane_pids,
    cpu_line,
    diff,
    kube_requests,
    metric,
    on_cluster,
    remove,
    wait_quiet,
    wait_root_ca,
)
from eventop.events import to_cloudevent, to_http  # noqa: E402
from eventop.kube import Kube  # noqa: E402
from eventop.testing.processes import RouterProcess, WatcherProcess  # noqa: E402

WRITES = ("create", "update", "apply", "patch", "delete")
warnings.filterwarnings("ignore", message="Unverified HTTPS request")
Obj = dict[str, Any]


def run(world: Kube, env: dict[str, str], count: int, where: str,
        servers: dict[str, int]) -> None:
    run_id = uuid.uuid4().hex[:6]
    prefix = f"fan{run_id}"
    src = f"{prefix}-src"
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    label = {"eventop-fanout": run_id}

    def make_namespace(name: str, labels: Obj | None = None) -> None:
        world.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": name, "labels": labels or {}}})

    wait_quiet(world)
    print(f"fan-out: one source into {count} namespaces, {where}")
    start = time.monotonic()
    make_namespace(src)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: make_namespace(n, label), names))
    print(f"  {count} namespaces created in {time.monotonic() - start:.1f} s")
    source = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "shared-settings", "namespace": src,
                           "labels": {"eventop-fanout": "source"}}, "data": {"v": "1"}}
    world.create(source)
    rule = f"{prefix}-rule"
    world.create({"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": rule},
                  "spec": {"ruleType": "configmap", "namespaces": [src],
                           "selector": {"matchLabels": {"eventop-fanout": "source"}},
                           "targetNamespaces": {"selector": {"matchLabels": label}}}})
    # When each copy first held each value (its data.v), seen by a watch of the rule's copies.
    copies = Sightings(world, "v1", "ConfigMap", label_selector=f"eventop.dev/copy-rule={rule}",
                       state=lambda obj: str((obj.get("data") or {}).get("v", "")))
    log_dir = tempfile.mkdtemp(prefix="eventop-fanout-")
    router = RouterProcess(env, log_dir=log_dir)
    watcher = WatcherProcess(router.url, env, log_dir=log_dir)
    try:
        copies.wait_synced(60)
        start = time.monotonic()
        deadline = start + 600
        while copies.holding("1") < count and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"  first copies: {copies.holding('1')} in place {time.monotonic() - start:.1f} s "
              "after the router started (caches listed, rule run, creates)")
        # The root-CA publisher's creates (and their watch events through the watcher and
        # the router) would otherwise run alongside the change measured below.
        waited = wait_root_ca(world, [src, *names], max(0.0, deadline - time.monotonic()))
        print(f"  (waited {waited:.0f} s more for the root-CA publisher to finish its "
              "kube-root-ca.crt creates in the new namespaces)")
        time.sleep(5.0)  # the echoes of the creates come back, the status settles

        before = kube_requests(router.url)
        engine0 = by_label(router.url, "eventop_engine_requests_total", "result")
        runs0 = metric(router.url, "eventop_engine_runs_total")
        events0 = by_label(router.url, "eventop_events_total", "outcome")
        changed = world.get("v1", "ConfigMap", "shared-settings", src)
        meter = CpuMeter({"router": router.proc.pid, "watcher": watcher.proc.pid, **servers})
        meter.start()
        t0 = t0_change = time.monotonic()
        world.replace({**changed, "data": {"v": "2"}})
        deadline = t0 + 120
        while copies.holding("2") < count and time.monotonic() < deadline:
            time.sleep(0.02)
        last = max((copies.at(ns, "shared-settings", "2") or float("nan") for ns in names),
                   default=0.0)
        until_last = meter.spent()
        time.sleep(5.0)  # the echoes of those writes come back
        with_echoes = meter.spent()
        spent = diff(kube_requests(router.url), before)
        writes = sum(v for k, v in spent.items() if k in WRITES)
        print(f"  a source change reached {copies.holding('2')}/{count} copies in "
              f"{last - t0:.3f} s (target < 1 s); router requests {dict(sorted(spent.items()))}: "
              f"{writes} writes (target exactly {count}), "
              f"{sum(spent.values()) - writes} other requests")
        engine = diff(by_label(router.url, "eventop_engine_requests_total", "result"), engine0)
        events = diff(by_label(router.url, "eventop_events_total", "outcome"), events0)
        print(f"  meanwhile the router answered {sum(events.values())} CloudEvents {events} (the "
              f"change and the echoes of its writes); engine requests {engine}; "
              f"{metric(router.url, 'eventop_engine_runs_total') - runs0:.0f} runs")
        print(f"  CPU seconds until the last copy was seen: {cpu_line(until_last)}; "
              f"5 s later (echoes): {cpu_line(with_echoes)} (self: this bench's own process)")

        before = kube_requests(router.url)
        with requests.Session() as session:
            for obj in (world.get("eventop.dev/v1", "CopyRule", rule),
                        world.get("v1", "ConfigMap", "shared-settings", src)):
                headers, body = to_http(to_cloudevent("update", obj, world.host))
                session.post(router.url, data=body, headers=headers, timeout=120)
        spent = diff(kube_requests(router.url), before)
        print(f"  resync of the rule and the source, nothing changed: router requests "
              f"{dict(spent) or 0} (target: no write, no read)")

        # The floor on this machine now: the same 1,000 writes from a bare client (16
        # threads, no router, no watcher, no engine), with the router stopped so that
        # nothing restores them.
        watcher.stop()
        router.stop()
        # (filtered here: a selector-limited list stopped after its first page on the v1.24
        # test API server)
        held = [c for c in world.list("v1", "ConfigMap")
                if (c["metadata"].get("labels") or {}).get("eventop.dev/copy-rule") == rule]
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda o: world.replace({**o, "data": {"v": "3"}}), held))
        bare = time.monotonic() - t0
        print(f"  the same {len(held)} writes from a bare client (16 threads, no pipeline): "
              f"{bare:.3f} s; eventop / bare: {(last - t0_change) / bare:.2f} "
              f"(load {os.getloadavg()[0]:.2f})")
    finally:
        copies.stop()
        keep = bool(os.environ.get("EVENTOP_BENCH_KEEP_LOGS"))
        watcher.stop(keep_log=keep)
        router.stop(keep_log=keep)
        if keep:
            print(f"  logs: {router.log_path} {watcher.log_path}")
        remove(world, rule, [src, *names])


def on_real(kubeconfig: str, count: int) -> None:
    world = connect(kubeconfig)
    run(world, {"KUBECONFIG": kubeconfig, **QUIET}, count, f"real API server {world.host}",
        control_plane_pids(kubeconfig))


def on_localkube(count: int) -> None:
    from eventop.localkube import LocalKube

    with LocalKube(crd_dir=str(REPO / "crds")) as server:
        world = Kube.connect(url=server.url)
        run(world, {"EVENTOP_KUBE_URL": server.url, **QUIET}, count,
            f"local API server {server.url} (no cluster: not the real figure)", {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--namespaces", type=int, default=1000)
    args = parser.parse_args()
    if not args.kubeconfig and not CLUSTER.exists():
        on_localkube(args.namespaces)
        return 0
    on_cluster(args.kubeconfig, "copy_fanout", lambda kubeconfig: on_real(kubeconfig,
                                                                          args.namespaces))
    return 0


if __name__ == "__main__":
    sys.exit(main())
