"""The whole of eventop as real processes around the real API server, with places to break it.

::

    watcher ──TcpProxy──▶ kube-apiserver ◀── router (gunicorn) ◀── SinkProxy ◀── watcher
      (its kubeconfig names the proxy)                  (K_SINK is the proxy)

The router talks to the API server directly, so API-side faults hit the watcher's list and
watch; :class:`~tests.support.sinkproxy.SinkProxy` plays a router that is down or failing,
while the real router keeps running and its ``/metrics`` count every write it made. The
watcher runs with ``--resync-seconds 0``: a change that reaches the cluster must come from
the watch, never from a periodic resync papering over a loss.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests
import yaml

from eventop.kube import Kube
from eventop.testing.processes import RouterProcess, WatcherProcess, free_port, metric_samples
from eventop.testing.waiting import wait_until
from tests.support.sinkproxy import SinkProxy
from tests.support.tcpproxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
WRITE_VERBS = {"apply", "create", "update", "patch", "delete"}
# The test cluster's certificate is self-signed (insecure-skip-tls-verify): one warning per
# request would bury the processes' own log lines.
QUIET = {"PYTHONWARNINGS": "ignore:Unverified HTTPS request"}


class Cluster:
    """The cluster under test; the state dir and script only when this run started it."""

    def __init__(self, kubeconfig: str, state_dir: str | None, script: Path | None) -> None:
        self.kubeconfig = kubeconfig
        self.state_dir = state_dir
        self.script = script
        doc = yaml.safe_load(Path(kubeconfig).read_text())
        self.server = doc["clusters"][0]["cluster"]["server"]

    @property
    def controllable(self) -> bool:
        """Can the suite restart this API server and compact its etcd?"""
        return bool(self.state_dir and self.script and self.script.exists())

    def restart_apiserver(self, down_seconds: float) -> None:
        assert self.script and self.state_dir
        subprocess.run([str(self.script), "restart-apiserver", self.state_dir,
                        str(down_seconds)], check=True, capture_output=True, timeout=180)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision; returns that revision."""
        assert self.state_dir
        ports = dict(line.split("=", 1) for line in
                     Path(self.state_dir, "ports").read_text().split())
        endpoint = f"127.0.0.1:{ports['ETCD_PORT']}"
        env = {**os.environ, "ETCDCTL_API": "3"}
        status = subprocess.run(["etcdctl", f"--endpoints={endpoint}", "endpoint", "status",
                                 "-w", "json"], check=True, capture_output=True, text=True,
                                env=env, timeout=30)
        revision = int(yaml.safe_load(status.stdout)[0]["Status"]["header"]["revision"])
        subprocess.run(["etcdctl", f"--endpoints={endpoint}", "compact", str(revision)],
                       check=True, capture_output=True, env=env, timeout=30)
        return revision


class Stack:
    def __init__(self, cluster: Cluster, log_dir: Path, rates_url: str) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.world = Kube.connect(kubeconfig=cluster.kubeconfig)
        self.world.field_manager = "eventop-tests-world"
        api = urlparse(cluster.server)
        self.api_proxy = TcpProxy(api.hostname or "127.0.0.1", api.port or 443)
        doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.api_proxy.port}"
        self.proxied_kubeconfig = log_dir / "kubeconfig-via-proxy"
        self.proxied_kubeconfig.write_text(yaml.safe_dump(doc))
        # Runs from events only: the faults are the watcher's (its connections go through
        # the proxy), and what is measured is that its events alone lose no change. With
        # the router's default, its own watch (not proxied) would converge without them.
        self.router = RouterProcess({"KUBECONFIG": cluster.kubeconfig, "RATES_API_URL": rates_url,
                                     "EVENTOP_LOG_LEVEL": "WARNING",
                                     "EVENTOP_RUN_ON_WATCH": "false", **QUIET},
                                    log_dir=str(log_dir))
        self.sink = SinkProxy(self.router.url)
        self.watcher: WatcherProcess | None = None
        self.watcher_metrics = 0

    # -- the watcher ---------------------------------------------------------------------

    def start_watcher(self, *extra: str) -> WatcherProcess:
        self.watcher_metrics = free_port()
        self.watcher = WatcherProcess(self.sink.url, {
            "KUBECONFIG": str(self.proxied_kubeconfig),
            "EVENTOP_METRICS_PORT": str(self.watcher_metrics),
            "EVENTOP_RESYNC_SECONDS": "0", **QUIET},
            log_dir=str(self.log_dir), extra_args=list(extra))
        # Its metrics answer once it has loaded the handlers and checked its resources; the
        # faults read them from the start.
        assert wait_until(self._watcher_metrics_up, 60, 0.2), \
            "the watcher's /metrics never answered"
        return self.watcher

    def _watcher_metrics_up(self) -> bool:
        try:
            self.watcher_metric("eventop_watcher_watch_starts_total")
        except requests.ConnectionError:
            return False
        return True

    def watcher_metric(self, name: str, **labels: str) -> float:
        return sum(v for found, v in metric_samples(
                   f"http://127.0.0.1:{self.watcher_metrics}/metrics", name, timeout=5)
                   if all(found.get(k) == want for k, want in labels.items()))

    def watches_settled(self, quiet: float = 2.0, timeout: float = 60.0) -> bool:
        """Wait until every watch is open and none was (re)started for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        last, since = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            starts = self.watcher_metric("eventop_watcher_watch_starts_total")
            if starts != last:
                last, since = starts, time.monotonic()
            elif time.monotonic() - since >= quiet and len(self.api_proxy.live()) >= 8:
                return True
            time.sleep(0.2)
        return False

    def stop_watcher(self) -> None:
        if self.watcher is not None:
            self.watcher.stop(keep_log=True)

    # -- the router's writes -------------------------------------------------------------

    def writes(self) -> Counter[str]:
        """Successful writes the router made so far, per resource."""
        out: Counter[str] = Counter()
        for labels, value in metric_samples(self.router.url + "/metrics",
                                            "eventop_kube_requests_total"):
            if labels.get("verb") in WRITE_VERBS and labels.get("code", "").startswith("2"):
                out[labels.get("resource", "")] += int(value)
        return out

    def close(self) -> None:
        self.stop_watcher()
        self.sink.close()
        self.router.stop(keep_log=True)
        self.api_proxy.close()


def converge(unmet: Callable[[], list[str]], timeout: float) -> tuple[float, list[str]]:
    """Poll until nothing is unmet; returns (seconds it took, what was still unmet)."""
    start = time.monotonic()
    left: list[str] = ["not checked"]
    while time.monotonic() - start < timeout:
        try:
            left = unmet()
        except Exception as exc:  # the API server itself may be coming back
            left = [f"cannot check: {exc}"]
        if not left:
            break
        time.sleep(0.1)
    return time.monotonic() - start, left


REPORTED: list[str] = []  # printed again at the end of the run (tests/faults/conftest.py)


def report(fault: str, **figures: Any) -> None:
    """One line per fault: on stdout (``pytest -s``), at the end of the run's summary, and
    appended to ``$EVENTOP_FAULT_REPORT`` if set."""
    parts = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in figures.items())
    line = f"FAULT {fault}: {parts}"
    print(line, flush=True)
    REPORTED.append(line)
    out = os.environ.get("EVENTOP_FAULT_REPORT")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")
