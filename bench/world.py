"""What the benchmarks on a real API server share: the cluster (named, or a throwaway one
from ``../shared/k8s/cluster``), the CRDs installed, a quiet start, and the router's API
requests read from its ``/metrics``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from eventop.kube import Kube  # noqa: E402
from eventop.kube.reflector import Reflector, Sink, Watched, WatchSettings  # noqa: E402
from eventop.testing.processes import metric_samples  # noqa: E402


def _shared() -> Path:
    """``shared/`` beside the checkout or beside one of its parents (a worktree sits deeper)."""
    if os.environ.get("EVENTOP_SHARED"):
        return Path(os.environ["EVENTOP_SHARED"])
    for parent in REPO.parents:
        if (parent / "shared").is_dir():
            return parent / "shared"
    return REPO.parent / "shared"


SHARED = _shared()
CLUSTER = SHARED / "k8s" / "cluster"
#: The environment of the router and watcher a bench starts: quiet, copy rules only, and the
#: caller's EVENTOP_THREADS / EVENTOP_MAX_IN_FLIGHT.
QUIET = {"PYTHONWARNINGS": "ignore:Unverified HTTPS request",
         "EVENTOP_LOG_LEVEL": os.environ.get("EVENTOP_LOG_LEVEL", "WARNING"),
         "EVENTOP_BUILTIN_HANDLERS": "copy_rules",
         **{k: os.environ[k] for k in ("EVENTOP_THREADS", "EVENTOP_MAX_IN_FLIGHT")
            if k in os.environ}}
warnings.filterwarnings("ignore", message="Unverified HTTPS request")


class Sightings(Sink):
    """When each object was first seen in each state (``state(obj)``: its data, say), by the
    project's own list-then-watch loop (:class:`~eventop.kube.reflector.Reflector`: resumes
    a broken watch, lists again after 410), so a bench times what a watch client sees."""

    def __init__(self, kube: Kube, api_version: str, kind: str, *,
                 label_selector: str | None = None,
                 state: Callable[[dict[str, Any]], str] = lambda obj: "") -> None:
        self.state = state
        self.now: dict[tuple[str, str], str] = {}  # (namespace, name) -> its state now
        self._first: dict[tuple[str, str, str], float] = {}  # + state -> first seen
        self._stop = threading.Event()
        self.reflector = Reflector(
            kube, lambda: Watched(kube.resource(api_version, kind), None, label_selector),
            self, WatchSettings(resync_seconds=0), self._stop,
            name=f"bench {kind} watch").start()

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list is in (everything after it is seen as it happens)."""
        return self.reflector.synced.wait(timeout)

    def at(self, namespace: str, name: str, state: str = "") -> float | None:
        """When ``namespace/name`` was first seen in ``state`` (``time.monotonic``)."""
        return self._first.get((namespace, name, state))

    def holding(self, state: str) -> int:
        """How many objects are in ``state`` now."""
        return sum(1 for s in list(self.now.values()) if s == state)

    def stop(self) -> None:
        self._stop.set()

    def _saw(self, obj: dict[str, Any]) -> None:
        at = time.monotonic()
        meta = obj["metadata"]
        key, state = (str(meta.get("namespace") or ""), str(meta["name"])), self.state(obj)
        self.now[key] = state
        self._first.setdefault((*key, state), at)

    def list_item(self, obj: dict[str, Any]) -> None:
        self._saw(obj)

    def offer(self, change: str, obj: dict[str, Any], timeout: float) -> bool:
        if change == "delete":
            meta = obj["metadata"]
            self.now.pop((str(meta.get("namespace") or ""), str(meta["name"])), None)
        else:
            self._saw(obj)
        return True

    def put(self, change: str, obj: dict[str, Any]) -> None:
        self.offer(change, obj, 0.0)


def on_cluster(kubeconfig: str | None, name: str, fn: Callable[[str], None]) -> bool:
    """``fn(kubeconfig)`` on the named cluster, else on a throwaway one started from
    ``../shared/k8s/cluster`` and stopped afterwards. False (nothing run) without either."""
    if kubeconfig:
        fn(kubeconfig)
        return True
    if not CLUSTER.exists():
        print(f"{name}: no cluster (pass --kubeconfig, or have {CLUSTER})")
        return False
    state = tempfile.mkdtemp(prefix=f"eventop-{name}-cluster-")
    try:
        out = subprocess.run([str(CLUSTER), "start", state], check=True, capture_output=True,
                             text=True)
        fn(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([str(CLUSTER), "stop", state], check=False, capture_output=True)
    return True


def connect(kubeconfig: str) -> Kube:
    """The bench's own client, with eventop's CRDs installed and served, once no namespace
    is still being deleted."""
    kube = Kube.connect(kubeconfig=kubeconfig)
    kube.field_manager = "bench-world"
    install_crds(kube)
    wait_quiet(kube)
    return kube


def install_crds(kube: Kube) -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "CustomResourceDefinition":
            kube.apply(doc)
    while kube.missing_kinds({("eventop.dev/v1", "CopyRule")}):
        time.sleep(0.5)


def remove(kube: Kube, rule: str, namespaces: Iterable[str]) -> None:
    """A run's CopyRule, then its namespaces (8 deletions at a time)."""
    kube.delete("eventop.dev/v1", "CopyRule", rule)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda ns: kube.delete("v1", "Namespace", ns), namespaces))


def wait_quiet(kube: Kube, timeout: float = 600.0) -> None:
    """Wait until no namespace is being deleted: a previous run's cleanup (the namespace
    controller deleting thousands of objects) would be measured too."""
    deadline = time.monotonic() + timeout
    said = False
    while time.monotonic() < deadline:
        going = [n for n in kube.list("v1", "Namespace") if n["metadata"].get("deletionTimestamp")]
        if not going:
            return
        if not said:
            print(f"  (waiting for {len(going)} terminating namespaces to go first)")
            said = True
        time.sleep(2.0)


def wait_root_ca(kube: Kube, namespaces: Iterable[str], timeout: float = 300.0) -> float:
    """Wait until kube-controller-manager's root-CA publisher has put ``kube-root-ca.crt``
    into each of ``namespaces`` (at its client's 20 requests/s, most of a minute for 1,000
    new namespaces, whose creates would otherwise run alongside what is measured); not at
    all when the first one has none (no publisher runs). Returns the seconds waited."""
    wanted = list(namespaces)
    start = time.monotonic()
    while wanted and time.monotonic() - start < timeout:
        published = {c["metadata"]["namespace"] for c in kube.list(
            "v1", "ConfigMap", field_selector="metadata.name=kube-root-ca.crt")}
        if published.issuperset(wanted) or wanted[0] not in published:
            break
        time.sleep(1.0)
    return time.monotonic() - start


def kube_requests(router_url: str) -> dict[str, float]:
    """The router's API requests so far, by verb (its cache's watches left out)."""
    return {verb: n for verb, n in by_label(router_url, "eventop_kube_requests_total",
                                            "verb").items() if verb != "watch"}


def metric(router_url: str, name: str, **labels: str) -> float:
    """The sum of a counter of the router's over the series with these labels."""
    return sum(value for found, value in metric_samples(router_url + "/metrics", name)
               if all(found.get(k) == v for k, v in labels.items()))


def by_label(router_url: str, name: str, label: str) -> dict[str, float]:
    """A counter of the router's summed by the value of one of its labels."""
    out: dict[str, float] = {}
    for found, value in metric_samples(router_url + "/metrics", name):
        key = found.get(label, "")
        out[key] = out.get(key, 0) + value
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0)}


# -- CPU: who spends it (the client, the pipeline and the control plane share the cores) -----

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CONTROL_PLANE = ("apiserver", "etcd", "kcm")


def control_plane_pids(kubeconfig: str) -> dict[str, int]:
    """kube-apiserver's, etcd's and kube-controller-manager's pids, from the state directory
    (the kubeconfig's) of a cluster started by ``../shared/k8s/cluster``; empty for another
    cluster."""
    state = Path(kubeconfig).resolve().parent
    pids = {}
    for name in CONTROL_PLANE:
        try:
            pids[name] = int((state / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return {}
    return pids


def _stat(pid: int) -> list[str]:
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its living descendants (the router's gunicorn worker is a child of its
    master)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` and its living descendants have used so far; 0
    if it is gone."""
    total = 0.0
    for current in process_tree(pid):
        try:
            fields = _stat(current)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return total


class CpuMeter:
    """CPU seconds spent by named processes between :meth:`start` and :meth:`spent`
    (``self`` is this process: ``time.process_time``, every thread)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {"self": time.process_time(),
                **{name: cpu_seconds(pid) for name, pid in self.pids.items()}}

    def start(self) -> CpuMeter:
        self._start = self._now()
        return self

    def spent(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self._start[name] for name in now}


def cpu_line(spent: dict[str, float]) -> str:
    """``router 0.61, apiserver 0.93, ... (total 2.10 CPU-s)``."""
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in spent.items())
    return f"{parts} (total {sum(spent.values()):.2f} CPU-s)"
