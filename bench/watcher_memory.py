"""Watcher memory while it lists and watches 10,000 ConfigMaps: peak RSS and its flatness.

Starts the local API server with 10,000 small ConfigMaps (a few keys, labels, an annotation:
the size of real configuration), a fast local sink, and ``python -m eventop.watcher run`` in a
subprocess (so the RSS measured is the watcher's own). Then it keeps changing ConfigMaps at a
steady rate, with periodic resyncs re-sending all 10,000, and samples the watcher's RSS from
``/proc/<pid>/status``. Prints figures; asserts nothing. Target: peak under 150 MB, flat while
events keep flowing.

    .venv/bin/python bench/watcher_memory.py [--objects 10000] [--seconds 60] [--rate 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eventop.testing.processes import WatcherProcess  # noqa: E402


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) in kB (psutil is not installed)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


class CountingSink:
    """Accepts every CloudEvent at once and counts them."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink.lock:
                    sink.count += 1
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the watcher hanging up at the end is expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def configmap(i: int, generation: int = 0) -> dict[str, Any]:
    ns = f"team-{i % 20}"
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"settings-{i:05d}", "namespace": ns,
                     "labels": {"app.kubernetes.io/name": f"svc-{i % 300}",
                                "app.kubernetes.io/part-of": "shop", "tier": "backend"},
                     "annotations": {"owner": "platform-team@example.com"}},
        "data": {"LOG_LEVEL": "info", "FEATURE_FLAGS": "checkout,search,recommendations",
                 "UPSTREAM_URL": f"http://svc-{i % 300}.{ns}.svc.cluster.local:8080",
                 "generation": str(generation),
                 "settings.yaml": "retries: 3\ntimeout: 5s\npool: 20\n" * 4},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long events flow")
    parser.add_argument("--rate", type=float, default=200.0, help="ConfigMap changes per second")
    parser.add_argument("--resync", type=float, default=20.0, help="watcher resync period")
    args = parser.parse_args()

    from eventop.localkube import LocalKube

    local = LocalKube(crd_dir=str(REPO / "crds"))
    url = local.start()
    sink = CountingSink()
    t0 = time.monotonic()
    namespaces = {configmap(i)["metadata"]["namespace"] for i in range(args.objects)}
    for ns in sorted(namespaces):
        local.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(args.objects):
        local.put(configmap(i))
    print(f"local API server: {args.objects} ConfigMaps in {len(namespaces)} namespaces "
          f"stored in {time.monotonic() - t0:.1f}s")

    # Its log goes to a file: an unread pipe would block the watcher once full.
    watcher = WatcherProcess(sink.url, {"EVENTOP_LOG_LEVEL": "WARNING"}, extra_args=[
        "--kube-url", url, "--resource", "v1/configmaps", "--resync-seconds", str(args.resync),
        "--metrics-port", "0", "--max-in-flight", "8", "--queue-size", "1000"])
    samples: list[tuple[float, str, int]] = []
    start = time.monotonic()

    def sample(label: str) -> int:
        rss = proc_status(watcher.proc.pid)["VmRSS"]
        samples.append((time.monotonic() - start, label, rss))
        return rss

    try:
        time.sleep(0.5)
        sample("started")
        while sink.count < args.objects:
            if watcher.returncode is not None:
                raise SystemExit(f"watcher exited early:\n{watcher.log()}")
            time.sleep(0.5)
            sample("initial list")
        listed_at = time.monotonic() - start
        print(f"initial LIST of {args.objects} delivered in {listed_at:.1f}s")
        sample("listed")

        rng = random.Random(1)
        generation = 0
        flow_start = time.monotonic()
        next_sample = flow_start + 2
        changes = 0
        while (now := time.monotonic()) - flow_start < args.seconds:
            generation += 1
            target = flow_start + changes / args.rate
            if target > now:
                time.sleep(target - now)
            local.put(configmap(rng.randrange(args.objects), generation))
            changes += 1
            if time.monotonic() >= next_sample:
                sample("flowing")
                next_sample += 2
        time.sleep(2)
        sample("end")
        peak = proc_status(watcher.proc.pid)["VmHWM"]
    finally:
        watcher.stop()
        sink.stop()
        local.stop()

    print(f"changes made while flowing: {changes} ({changes / args.seconds:.0f}/s), "
          f"events accepted by the sink: {sink.count} (includes resyncs every {args.resync:.0f}s)")
    print("\n   t(s)  phase          RSS(MB)")
    shown = samples if len(samples) <= 40 else samples[:: max(1, len(samples) // 40)]
    for t, label, rss in shown:
        print(f"{t:7.1f}  {label:<13} {rss / 1024:8.1f}")
    flowing = [rss for _, label, rss in samples if label in ("flowing", "end")]
    if flowing:
        half = len(flowing) // 2 or 1
        first = sum(flowing[:half]) / half / 1024
        second = sum(flowing[half:]) / max(1, len(flowing) - half) / 1024
        print(f"\nRSS while flowing: min {min(flowing) / 1024:.1f} MB, max "
              f"{max(flowing) / 1024:.1f} MB; mean of first half {first:.1f} MB, "
              f"of second half {second:.1f} MB")
    print(f"peak RSS (VmHWM) of the watcher: {peak / 1024:.1f} MB  (target < 150 MB)")


if __name__ == "__main__":
    main()
