"""``make demo``: the whole pipeline on this machine, then a report of what the handlers did.

Without ``KUBECONFIG`` it starts an embedded local API server (``localkube``) and a loopback
stand-in for the rates provider, so it needs neither a cluster nor the internet. With
``KUBECONFIG`` set it runs against that cluster (the CRDs must be installed:
``kubectl apply -k crds/``) and the public rates API, in a namespace of its own.

Either way: the router runs under gunicorn, the watcher lists and watches the API server and
posts CloudEvents to the router, the world changes (the shipped recordings are replayed and the
example resources applied), and the demo waits until the handlers converged, prints the objects
they created and exits 0 — or 1, saying what did not happen.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from demo.processes import REPO, RouterProcess, WatcherProcess
from demo.world import Expectations, LocalWorld, World, load_examples, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds to wait for the handlers to converge (default 90)")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave everything running until Ctrl-C after the report")
    args = parser.parse_args(argv)

    log_dir = tempfile.mkdtemp(prefix="eventop-demo-")
    kubeconfig = os.environ.get("KUBECONFIG")
    stack: list = []
    try:
        if kubeconfig:
            from demo.world import ClusterWorld

            print(f"eventop demo — against the cluster of KUBECONFIG={kubeconfig}")
            world: World = ClusterWorld(kubeconfig)
            env = {"KUBECONFIG": kubeconfig}
        else:
            from demo.provider import RatesStandIn
            from eventop.localkube import LocalKube

            print("eventop demo — no KUBECONFIG: embedded local API server, no cluster needed")
            local = LocalKube(crd_dir=str(REPO / "crds"))
            local.start()
            stack.append(local.stop)
            print(f"  [1/5] local API server        {local.url}  (CRDs from crds/ installed)")
            rates = RatesStandIn()
            rates_url = rates.__enter__()
            stack.append(lambda: rates.__exit__(None, None, None))
            print(f"  [2/5] rates provider stand-in {rates_url}  (set RATES_API_URL for real)")
            world = LocalWorld(local)
            env = {"EVENTOP_KUBE_URL": local.url, "RATES_API_URL": rates_url}

        router = RouterProcess(env, log_dir=log_dir)
        stack.append(lambda: router.stop(keep_log=True))
        print(f"  [3/5] router (gunicorn)       {router.url}  log: {router.log_path}")
        watcher = WatcherProcess(router.url, {**env, "EVENTOP_RESYNC_SECONDS": "30"},
                                 log_dir=log_dir)
        stack.append(lambda: watcher.stop(keep_log=True))
        print(f"  [4/5] watcher                 sink={router.url}  log: {watcher.log_path}")

        expect = Expectations()
        if isinstance(world, LocalWorld):
            changes = world.replay_recordings(REPO / "tests" / "recordings", expect)
            print(f"  [5/5] world: replayed {changes} recorded changes (copy-rules, "
                  "mirrors-and-rates) and applied the examples in crds/examples/")
        else:
            print("  [5/5] world: applied the examples in crds/examples/ "
                  f"(namespace {world.namespace})")
        world.apply_examples(load_examples(REPO / "crds" / "examples"), expect)

        start = time.monotonic()
        missing = expect.wait(world.kube, args.timeout)
        print(f"\nconverged in {time.monotonic() - start:.1f}s" if not missing
              else f"\nNOT converged after {args.timeout:.0f}s")
        report(world.kube, world.namespaces())
        if not isinstance(world, LocalWorld):
            print(f"\neverything is in namespace {world.namespace}; remove it with "
                  f"`kubectl delete namespace {world.namespace}`")
        if isinstance(world, LocalWorld):
            print("\n(the local API server runs no kubelet or workload controllers: registry "
                  "pods never start here, so mirrors stay Ready=False/RegistryNotReady; on a "
                  "cluster they turn Ready once their StatefulSet and DaemonSet are)")
        refresh = world.refresh(router.url)
        print(f"\nrate refresh event (what the CronJob sends): {refresh}")
        if missing:
            print("\nwhat did not happen:")
            for line in missing:
                print(f"  - {line}")
            print(f"\nlogs: {router.log_path} {watcher.log_path}")
            return 1
        if args.keep_running:
            print("\nrunning; Ctrl-C to stop")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for stop in reversed(stack):
            stop()


if __name__ == "__main__":
    sys.exit(main())
