"""Router throughput: CloudEvents/s through ``python -m eventop.router`` next to a bare Flask app.

Both run under gunicorn with the same settings (workers, threads, worker class, keep-alive:
the bare app is served by :mod:`eventop.router.server` itself), in the same run, driven by the same
load: a few client processes on loopback, each posting binary-mode CloudEvents carrying a
recorded ConfigMap over one keep-alive connection. The router has a single no-op handler
(registered by this module, loaded through ``EVENTOP_HANDLERS`` with the built-in handlers
off), so the figure is the router's own cost: CloudEvent parsing and validation, dispatch,
multiprocess metrics and the JSON log line. The bare app only reads the body and answers
200. Runs alternate (bare, router, bare, router, ...) so drift hits both; medians are
reported, with events per server CPU-second beside events/s (robust to other load). Target: the
router handles at least 0.8 of the bare app's rate. Prints; asserts nothing.

On a machine with two or more CPUs the server (every thread of the gunicorn master and its
workers) runs on the first half of the CPUs and the client processes on the rest
(``--no-pin`` turns this off). Sharing cores with its clients, a server is preempted at
random points of a request and its CPU per event swung by +-10% from run to run (the bare app
2,545-3,013 events per CPU-second on 2 cores within minutes); pinned, runs agree within 3%.

    .venv/bin/python bench/router_throughput.py [--seconds 4] [--rounds 3] [--clients 4]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.world import cpu_seconds, process_tree  # noqa: E402
from eventop.handlers import Event, on  # noqa: E402
from eventop.testing.processes import Process, RouterProcess, free_port, wait_http  # noqa: E402

# How the router and the bare server import this file (PYTHONPATH is the repository).
MODULE = "bench.router_throughput"
EVENT_TYPE = "dev.knative.apiserver.resource.update"


@on("dev.knative.apiserver.resource.*", api_version="v1", kind="ConfigMap")
def noop(event: Event, kube: Any) -> None:
    """The no-op handler the router dispatches to (this module is its EVENTOP_HANDLERS)."""


def bare_app() -> Any:
    """The baseline: Flask reading the body and answering 200, nothing else."""
    from flask import Flask, Response, request

    app = Flask("bare")

    @app.post("/")
    def receive() -> Response:
        request.get_data(cache=False)
        return Response(b'{"ok": true}', status=200, mimetype="application/json")

    return app


def recorded_configmap() -> dict[str, Any]:
    """A real ConfigMap from the recordings (with managedFields, as the watcher sends it)."""
    path = REPO / "tests" / "recordings" / "copy-rules" / "api_v1_configmaps.watch.jsonl"
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if item["object"]["metadata"]["name"] == "registry-config":
            return item["object"]
    raise SystemExit(f"no registry-config ConfigMap in {path}")


def cloudevent_headers(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj["metadata"]
    return {"ce-specversion": "1.0", "ce-type": EVENT_TYPE, "ce-source": "https://10.96.0.1:443",
            "ce-subject": f"/apis/v1/namespaces/{meta['namespace']}/configmaps/{meta['name']}",
            "ce-time": "2026-11-21T07:40:58Z", "ce-kind": "ConfigMap", "ce-name": meta["name"],
            "ce-namespace": meta["namespace"], "ce-apiversion": "v1",
            "Content-Type": "application/json"}


def _client(port: int, body: bytes, headers: dict[str, str], start_at: float, end_at: float,
            index: int, cpus: set[int] | None) -> tuple[int, int]:
    """Post events until ``end_at``; count the 2xx answered within [start_at, end_at)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    ok = failed = n = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while True:
        now = time.monotonic()
        if now >= end_at:
            break
        n += 1
        try:
            conn.request("POST", "/", body=body,
                         headers={**headers, "ce-id": f"bench-{index}-{n}"})
            resp = conn.getresponse()
            resp.read()
            good = 200 <= resp.status < 300
            if resp.getheader("connection", "").lower() == "close":
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
            good = False
        if time.monotonic() >= start_at:
            ok, failed = (ok + 1, failed) if good else (ok, failed + 1)
    conn.close()
    return ok, failed


def pin_server(master: int, cpus: set[int]) -> None:
    """Every thread of the master and its workers onto ``cpus`` (affinity is per thread,
    and gunicorn's worker threads exist already)."""
    for pid in process_tree(master):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:  # a process that ended meanwhile
            continue
        for tid in threads:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)


def cpu_split(pin: bool) -> tuple[set[int], set[int]] | None:
    """(server CPUs, client CPUs): the first half of this process's CPUs and the rest, or
    None when not pinning (asked not to, one CPU, or no affinity on this platform)."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def drive(port: int, master: int, clients: int, seconds: float, body: bytes,
          headers: dict[str, str], split: tuple[set[int], set[int]] | None
          ) -> tuple[float, float, int]:
    """Run ``clients`` processes against ``port``.

    Returns (events/s, events per server CPU-second, failures). The second figure is what
    a busy machine distorts least: other load on the host lowers events/s, but hardly the
    CPU the server spends per event.
    """
    if split:
        pin_server(master, split[0])
    start_at = time.monotonic() + 1.0  # pool start-up and connection warm-up excluded
    end_at = start_at + seconds
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        pending = pool.starmap_async(_client, [
            (port, body, headers, start_at, end_at, i, split[1] if split else None)
            for i in range(clients)])
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu_before = cpu_seconds(master)
        results = pending.get()
        cpu = cpu_seconds(master) - cpu_before
    handled = sum(ok for ok, _ in results)
    return handled / seconds, handled / cpu if cpu else 0.0, sum(f for _, f in results)


def serve_bare(args: argparse.Namespace) -> None:
    """Internal: the bare app under exactly the router's gunicorn settings."""
    from eventop.router.server import ServerOptions, serve

    serve(ServerOptions(host="127.0.0.1", port=args.port, workers=args.workers,
                        threads=args.threads, app=f"{MODULE}:bare_app"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per app, alternating")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn workers (both apps)")
    parser.add_argument("--threads", type=int, default=32, help="threads per worker (both apps)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="server and clients on separate CPUs (default: yes, with >= 2)")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args)
        return

    obj = recorded_configmap()
    body = json.dumps(obj).encode()
    headers = cloudevent_headers(obj)
    env = {"EVENTOP_BUILTIN_HANDLERS": "none", "EVENTOP_HANDLERS": MODULE,
           "EVENTOP_KUBE_URL": f"http://127.0.0.1:{free_port()}"}  # never called by noop
    common = ["--workers", str(args.workers), "--threads", str(args.threads)]
    servers: dict[str, Process] = {}
    ports = {"bare": free_port()}
    try:
        servers["bare"] = Process("bare", [MODULE, "--serve-bare", "--port", str(ports["bare"]),
                                           *common], env, cwd=REPO)
        wait_http(f"http://127.0.0.1:{ports['bare']}/", proc=servers["bare"].proc)
        router_process = RouterProcess(env, args.workers, cwd=REPO,
                                       extra_args=["--threads", str(args.threads)])
        servers["router"], ports["router"] = router_process, router_process.port
        split = cpu_split(args.pin)
        print(f"router throughput: {args.workers} gunicorn workers x {args.threads} threads "
              f"(same for both apps), {args.clients} keep-alive clients, {args.seconds:g}s "
              f"per run, {len(body)}-byte ConfigMap event, {os.cpu_count()} CPUs")
        print(f"  server on CPUs {sorted(split[0])}, clients on CPUs {sorted(split[1])}" if split
              else "  not pinned: server and clients share the CPUs")
        rates: dict[str, list[float]] = {"bare": [], "router": []}
        per_cpu: dict[str, list[float]] = {"bare": [], "router": []}
        for r in range(args.rounds):
            for name in ("bare", "router"):
                rate, efficiency, failures = drive(ports[name], servers[name].proc.pid,
                                                   args.clients, args.seconds, body, headers,
                                                   split)
                rates[name].append(rate)
                per_cpu[name].append(efficiency)
                extra = f", {failures} failed requests" if failures else ""
                print(f"  round {r + 1}: {name:6s} {rate:8.0f} events/s  "
                      f"{efficiency:8.0f} events per server CPU-second{extra}")
        bare, router = statistics.median(rates["bare"]), statistics.median(rates["router"])
        bare_cpu = statistics.median(per_cpu["bare"])
        router_cpu = statistics.median(per_cpu["router"])
        print(f"bare Flask app : {bare:8.0f} events/s  {bare_cpu:8.0f} per server CPU-s "
              f"(median of {args.rounds})")
        print(f"eventop router : {router:8.0f} events/s  {router_cpu:8.0f} per server CPU-s "
              f"(median of {args.rounds})")
        print(f"ratio router/bare: {router / bare:.2f} events/s (target >= 0.8), "
              f"{router_cpu / bare_cpu:.2f} per CPU-second; load average now "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
