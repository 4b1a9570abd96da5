"""The floor under a fan-out: 1,000 updates of copies we own, by verb and concurrency, with
what each costs the client process and the API server.

1,000 ConfigMaps in 1,000 namespaces, shaped as CopyRule copies (the copy rules' own
``desired_copy``: labels, annotations, an ownerReference to a real CopyRule), are updated
with a new value, 1,000 writes at a time, from the project's own :class:`eventop.kube.Kube`
under the copy rules' field manager, by:

* ``put``: PUT of the engine's replacement body (the last written object, so with its
  resourceVersion as precondition, as the engine's write-through cache holds it);
* ``apply``: server-side apply of the desired copy, ``force=true``;
* ``merge``: JSON merge patch of the same desired copy.

Each verb first makes one untimed round (its managedFields entry settles, the client's pool
holds a connection per thread), then one timed round per concurrency. Printed per round:
seconds, the client process's CPU seconds (``time.process_time``: every thread), the CPU
seconds kube-apiserver and etcd spent (their ``/proc/<pid>/stat``; the cluster's state
directory holds their pids), kube-controller-manager's (its garbage collector watches every
ConfigMap) and the connections the client opened. All share the machine's cores, so
``wall ~ (client + server CPU) / cores`` when the cores are the bound. Asserts nothing.

    .venv/bin/python bench/write_floor.py --kubeconfig DIR/kubeconfig [--count 1000]
        [--concurrency 8,16,32,64] [--verbs put,apply,merge] [--repeat 1]

Needs a cluster started by ``../shared/k8s/cluster`` (its state directory, the
kubeconfig's, gives the server pids); without ``--kubeconfig`` it starts a throwaway one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.world import (  # noqa: E402
    CpuMeter,
    connect,
    control_plane_pids,
    on_cluster,
    remove,
    wait_quiet,
)
from eventop.engine.plan import replacement  # noqa: E402
from eventop.handlers.copy_rules.desired import desired_copy  # noqa: E402
from eventop.handlers.registry import field_manager_for  # noqa: E402
from eventop.kube import Kube  # noqa: E402

Obj = dict[str, Any]
MANAGER = field_manager_for("eventop.handlers.copy_rules", "copy-rules")


class Copies:
    """The copies being written: their desired form per value, and the last answer of each
    (what the engine's write-through cache would hold)."""

    def __init__(self, kube: Kube, rule: Obj, source_ns: str, namespaces: list[str]) -> None:
        self.kube, self.rule, self.source_ns = kube, rule, source_ns
        self.namespaces = namespaces
        self.last: dict[str, Obj] = {}

    def desired(self, ns: str, value: str) -> Obj:
        source = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "shared-settings", "namespace": self.source_ns},
                  "data": {"v": value, "settings.yaml": "log-level: info\nreplicas: 3\n"}}
        return desired_copy(self.rule, source, ns)

    def create(self, ns: str) -> None:
        self.last[ns] = self.kube.create(self.desired(ns, "0"))

    def write(self, verb: str, ns: str, value: str) -> None:
        want = self.desired(ns, value)
        meta = want["metadata"]
        if verb == "put":
            self.last[ns] = self.kube.replace(replacement(self.last[ns], want))
        elif verb == "apply":
            self.last[ns] = self.kube.apply(want, force=True)
        elif verb == "merge":
            self.last[ns] = self.kube.patch("v1", "ConfigMap", meta["name"], ns, want)
        else:
            raise ValueError(f"verb must be put, apply or merge, not {verb!r}")


def connections(kube: Kube) -> int:
    """Connections the client's urllib3 pools have opened so far (a pool smaller than the
    writes in flight opens, and drops, one per request over its size)."""
    pools = kube.api.rest_client.pool_manager.pools
    # (a RecentlyUsedContainer: its keys can be listed, it cannot be iterated)
    return sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118


def measure(servers: dict[str, int], kube: Kube, threads: int, items: list[str],
            fn: Callable[[str], None]) -> dict[str, float]:
    """Run ``fn`` over ``items`` on ``threads`` threads: wall, client and server CPU, and
    the connections opened."""
    conns0 = connections(kube)
    meter, t0 = CpuMeter(servers).start(), time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, items))
    wall, spent = time.monotonic() - t0, meter.spent()
    return {"wall": wall, "client": spent.pop("self"), **spent,
            "connections": connections(kube) - conns0}


def row(label: str, n: int, m: dict[str, float]) -> str:
    server = m["apiserver"] + m["etcd"]
    return (f"  {label:<16} {m['wall']:6.3f} s  client {m['client']:5.2f} CPU-s "
            f"({1000 * m['client'] / n:4.2f} ms/write)  apiserver+etcd {server:5.2f} CPU-s "
            f"({1000 * server / n:4.2f} ms/write: {m['apiserver']:.2f} + {m['etcd']:.2f})  "
            f"kcm {m['kcm']:.2f}  +{m['connections']:.0f} conns  load {os.getloadavg()[0]:.2f}")


def run(kubeconfig: str, count: int, concurrency: list[int], verbs: list[str],
        repeat: int) -> None:
    servers = control_plane_pids(kubeconfig)
    if not servers:
        print(f"write_floor: {Path(kubeconfig).resolve().parent} holds no apiserver.pid: not "
              "a cluster started by ../shared/k8s/cluster, so the server's CPU cannot be read")
        return
    admin = connect(kubeconfig)
    wait_quiet(admin)
    kube = admin.for_manager(MANAGER)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"wf{run_id}"
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    src = f"{prefix}-src"
    rule_name = f"{prefix}-rule"
    print(f"write floor: {count} ConfigMaps in {count} namespaces, {admin.host}, "
          f"field manager {MANAGER}, load {os.getloadavg()[0]:.2f}")
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: admin.create({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": n}}), [src, *names]))
        rule = admin.create({
            "apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": rule_name},
            "spec": {"ruleType": "configmap", "namespaces": [src],
                     "selector": {"matchLabels": {"eventop-write-floor": "none"}},
                     "targetNamespaces": {"selector": {"matchLabels": {
                         "eventop-write-floor": "none"}}}}})
        copies = Copies(kube, rule, src, names)
        print(row("create (POST)", count, measure(servers, kube, 16, names, copies.create)))
        time.sleep(2.0)  # the garbage collector's and the watch cache's share of the creates
        values = iter(range(1, 1_000_000))

        def writes(verb: str, threads: int) -> dict[str, float]:
            value = str(next(values))
            return measure(servers, kube, threads, names,
                           lambda ns: copies.write(verb, ns, value))

        for r in range(repeat):
            for verb in verbs[r % len(verbs):] + verbs[:r % len(verbs)]:
                # untimed: the verb's managedFields entry settles, the pool holds a connection
                # per thread (how many a round opens is printed: +N conns)
                writes(verb, max(concurrency))
                for threads in concurrency:
                    print(row(f"{verb} x{threads}", count, writes(verb, threads)))
                    time.sleep(1.0)
        last = copies.last[names[0]]
        print(f"  (one copy as the server answers it: {len(json.dumps(last))} bytes of JSON, "
              f"{len(last['metadata'].get('managedFields') or [])} managedFields entries)")
    finally:
        remove(admin, rule_name, [src, *names])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", default="8,16,32,64",
                        help="comma-separated thread counts (default 8,16,32,64)")
    parser.add_argument("--verbs", default="put,apply,merge",
                        help="comma-separated, of put, apply, merge (default all three)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure every verb this many times (rotating their order)")
    args = parser.parse_args()
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
    verbs = [v.strip() for v in args.verbs.split(",") if v.strip()]
    if not verbs or set(verbs) - {"put", "apply", "merge"}:
        parser.error(f"--verbs takes put, apply and/or merge, got {args.verbs!r}")
    on_cluster(args.kubeconfig, "write_floor",
               lambda kubeconfig: run(kubeconfig, args.count, concurrency, verbs, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
