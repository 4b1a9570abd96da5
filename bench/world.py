"""What the benchmarks on a real API server share: the cluster (named, or a throwaway one
from ``../shared/k8s/cluster``), the CRDs installed, a quiet start, and the router's API
requests read from its ``/metrics``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402
import yaml  # noqa: E402

from eventop.kube import Kube  # noqa: E402


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


def kube_requests(router_url: str) -> dict[str, float]:
    """The router's API requests so far, by verb (its cache's watches left out)."""
    text = requests.get(router_url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'eventop_kube_requests_total\{(.*)\} ([0-9.e+]+)$', line)
        if m:
            verb = re.search(r'verb="([^"]*)"', m.group(1))
            if verb and verb.group(1) != "watch":
                out[verb.group(1)] = out.get(verb.group(1), 0) + float(m.group(2))
    return out


def metric(router_url: str, name: str, **labels: str) -> float:
    """The sum of a counter of the router's over the series with these labels."""
    text = requests.get(router_url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0)}
