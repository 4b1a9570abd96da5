"""``python -m demo`` as a user runs it: local unless asked, one line per failure, and
nothing left running after SIGTERM.

Each test runs the real demo as a subprocess (a few seconds each: the router under gunicorn,
the watcher and the replay of the recordings).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.__main__ import start_local
from demo.provider import RatesStandIn
from eventop.kube import Kube, owner_reference
from eventop.localkube import LocalKube
from eventop.testing.processes import free_port

REPO = Path(__file__).resolve().parents[2]


def kubeconfig_for(url: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTOP_", "KUBECONFIG", "K_SINK", "RATES_API_URL"))}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def run_demo(*args: str, env: dict[str, str], timeout: float = 240
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "demo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


class _Counting(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        self.send_response(503)
        self.end_headers()

    do_POST = do_PUT = do_PATCH = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def someones_cluster() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server standing for a real cluster: it only records who asked for what."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen  # type: ignore
    finally:
        server.shutdown()
        server.server_close()


def test_an_exported_kubeconfig_never_turns_the_demo_into_a_cluster_run(
        someones_cluster: tuple[str, list[str]], tmp_path: Path) -> None:
    url, seen = someones_cluster
    config = kubeconfig_for(url, tmp_path / "kubeconfig")
    proc = run_demo("--timeout", "120", env=demo_env(KUBECONFIG=str(config)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KUBECONFIG is set and ignored: pass --cluster" in proc.stdout
    assert "embedded local API server" in proc.stdout
    assert seen == []  # not one request reached that cluster


def test_the_cluster_named_by_the_flag_is_used(tmp_path: Path) -> None:
    with LocalKube(crd_dir=str(REPO / "crds")) as cluster, RatesStandIn() as rates:
        config = kubeconfig_for(cluster.url, tmp_path / "kubeconfig")
        proc = run_demo("--cluster", "--kubeconfig", str(config), "--timeout", "120",
                        env=demo_env(RATES_API_URL=rates.url))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"against the cluster of {config} (--cluster)" in proc.stdout
        kube = Kube.connect(url=cluster.url)
        rates_there = kube.list("eventop.dev/v1", "ExchangeRate", namespace="eventop-demo")
        assert rates_there and all(r["status"]["rate"] for r in rates_there)
        assert kube.list("eventop.dev/v1", "CopyRule") == []  # never cluster-wide rules
        # A Database's finalizer would outlive the demo's router: none is made there.
        assert kube.list("eventop.dev/v1", "Database", namespace="eventop-demo") == []
    assert "\nDatabase (0)\n" in proc.stdout and "demo plays a controller" not in proc.stdout


def test_the_local_api_server_collects_a_copy_made_after_its_rule_was_deleted(
        tmp_path: Path) -> None:
    """The replay deletes a CopyRule while the router makes its copies: a run planned from
    the cache before the deletion reached it can create a copy after the rule is gone. The
    real garbage collector deletes such a dangling dependent; so must the demo's server, or
    the demo waits for that copy to go until it times out."""
    with contextlib.ExitStack() as stack:
        world, _ = start_local(stack, str(tmp_path))
        kube = world.kube
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-c"}})
        rule = kube.create({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                            "metadata": {"name": "registry-credentials"},
                            "spec": {"ruleType": "secret", "namespaces": ["default"]}})
        kube.delete("eventop.dev/v1", "CopyRule", "registry-credentials")
        kube.create({"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": "regcred", "namespace": "team-c",
                                  "ownerReferences": [owner_reference(rule)]}})
        world.cluster.settle()
        assert kube.list("v1", "Secret", namespace="team-c") == []


def database_block(out: str, name: str) -> list[str]:
    """The report's lines about Database ``name``: its own line, then what it owns and keeps."""
    lines = out[out.index("\nDatabase ("):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}  "))
    end = next((i for i in range(start + 1, len(lines))
                if not lines[i].startswith("      ")), len(lines))
    return lines[start:end]


def test_the_local_demo_shows_each_database_with_what_it_owns_and_the_controllers_it_played(
        ) -> None:
    out, secrets = demo_kept_running(lambda kube: [
        kube.get("v1", "Secret", f"{name}-credentials", "shop")
        for name in ("orders", "inventory")])
    # What the demo did in a controller's place is said as it happens, and in the report.
    assert "  demo plays a controller: StatefulSet shop/orders-pg16: 1 of 1 pods reported " \
           "Ready, claims data-orders-pg16-0 made (as the StatefulSet controller and the " \
           "kubelet would)" in out
    assert "  demo plays a controller: Job shop/orders-init: reported Complete (as the Job " \
           "controller would; no pod ran, no SQL was executed)" in out
    assert "\nDatabase (2)\n  (the local API server runs no kubelet, StatefulSet or Job " \
           "controller: the demo played them," in out
    orders = database_block(out, "shop/orders")
    assert re.search(r"BackupHealthy=Unknown\(AwaitingFirstBackup\), Initialized=True\("
                     r"Initialized\), Progressing=False\(Stable\), Ready=True\(Running\)  .*"
                     r"'endpoint': 'orders.shop.svc:5432'.*'phase': 'Ready'", orders[0])
    image = re.search(r"'image': '(docker.io/library/postgres:16\.\d+)'", orders[0])
    assert image, orders[0]
    assert orders[1:] == [
        "      └ ConfigMap shop/orders-config",
        f"      └ CronJob shop/orders-backup  schedule '0 0 * * *', {image[1]}",
        "      └ Job shop/orders-init  Complete",
        "      └ Service shop/orders",
        "      └ Service shop/orders-hl",
        f"      └ StatefulSet shop/orders-pg16  1/1 ready, {image[1]}",
        "      kept, not owned (they outlive it):",
        "      └ PersistentVolumeClaim shop/data-orders-pg16-0  5Gi",
        "      └ PersistentVolumeClaim shop/orders-backups  5Gi",
        "      └ Secret shop/orders-credentials  keys database, host, password, port, "
        "replication-password, superuser-password, uri, username (values not shown)"]
    replicated = database_block(out, "shop/inventory")
    assert "Ready=True(Running)" in replicated[0] and "'readyReplicas': 3" in replicated[0]
    assert re.search(r"└ StatefulSet shop/inventory-pg17  3/3 ready", "\n".join(replicated))
    assert [line for line in replicated if "data-inventory" in line] == [
        f"      └ PersistentVolumeClaim shop/data-inventory-pg17-{i}  20Gi" for i in range(3)]
    for secret in secrets:  # no password, in any form, anywhere in what the demo printed
        for key in ("password", "superuser-password", "replication-password", "uri"):
            value = base64.b64decode(secret["data"][key]).decode()
            assert value not in out, f"the demo printed {secret['metadata']['name']}'s {key}"


def demo_kept_running(look: Callable[[Kube], Any]) -> tuple[str, Any]:
    """Run the local demo with --keep-running until its report is out; then ``look`` at its
    API server (through the kubeconfig it printed), stop it with SIGTERM, and return all it
    printed (stdout and stderr) and what ``look`` returned."""
    proc = subprocess.Popen([sys.executable, "-m", "demo", "--keep-running", "--timeout",
                             "120"], cwd=REPO, env=demo_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or (lines[-1] and "running; Ctrl-C" not in lines[-1]):
            lines.append(proc.stdout.readline())
        out = "".join(lines)
        config = re.search(r"kubectl --kubeconfig (\S+) get", out)
        assert config, out
        seen = look(Kube.connect(kubeconfig=config[1]))
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + rest + err
    return out + rest + err, seen


def test_an_unreachable_cluster_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    config = kubeconfig_for(f"http://127.0.0.1:{free_port()}", tmp_path / "kubeconfig")
    proc = run_demo("--cluster", "--kubeconfig", str(config), env=demo_env())
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m demo: cannot use the cluster of {config}: Unreachable: ")
    assert line.endswith("; nothing was started")
    assert "router" not in proc.stdout


def test_a_cluster_without_the_crds_says_to_install_them(tmp_path: Path) -> None:
    with LocalKube(crd_dir=None) as cluster:
        config = kubeconfig_for(cluster.url, tmp_path / "kubeconfig")
        proc = run_demo("--cluster", "--kubeconfig", str(config), env=demo_env())
        namespaces = {n["metadata"]["name"] for n in Kube.connect(url=cluster.url).list(
            "v1", "Namespace")}
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert "does not serve CopyRule.eventop.dev/v1, Database.eventop.dev/v1, " \
           "ExchangeRate.eventop.dev/v1, RegistryMirror.eventop.dev/v1: install the CRDs " \
           "first (kubectl apply -k crds/)" in line
    assert "eventop-demo" not in namespaces


@pytest.mark.parametrize(("args", "said"), [
    (["--kubeconfig", "/tmp/x"], "--kubeconfig is only used with --cluster"),
    (["--cluster", "--kubeconfig", "/nonexistent/config"],
     "--cluster: kubeconfig /nonexistent/config does not exist"),
    (["--timeout", "0"], "argument --timeout: expected a number greater than 0, not '0'"),
])
def test_flag_mistakes_are_one_line_and_exit_status_2(args: list[str], said: str) -> None:
    proc = run_demo(*args, env=demo_env())
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("python -m demo: error: ") and said in line


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize(("wait_for", "status"), [
    ("running; Ctrl-C (or SIGTERM) stops everything", 0),  # --keep-running, after the report
    ("[4/5] watcher", 128 + signal.SIGTERM),  # while waiting for the handlers
])
def test_sigterm_stops_the_router_and_the_watcher(wait_for: str, status: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "demo", "--keep-running"], cwd=REPO,
                            env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if not line or wait_for in line:
                break
        assert wait_for in seen[-1], "".join(seen)
        children = _descendants(proc.pid)
        assert len(children) >= 3  # router master, its worker(s), the watcher
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # the test failed: leave nothing behind it
            for pid in (children or _descendants(proc.pid)) | {proc.pid}:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == status, err
    assert "SIGTERM: stopping what the demo started" in err
    assert [pid for pid in children if _alive(pid)] == []


def test_a_rates_url_given_is_used_by_the_local_demo_and_a_wrong_one_refused() -> None:
    """The demo says "set RATES_API_URL for a real one": it used to go on with its stand-in."""
    proc = run_demo(env=demo_env(RATES_API_URL="notaurl"))
    assert (proc.returncode, proc.stderr) == (
        2, "python -m demo: error: RATES_API_URL: expected an http:// or https:// URL, not "
           "'notaurl'\n")
    with RatesStandIn() as rates:
        proc = run_demo("--timeout", "120", env=demo_env(RATES_API_URL=rates.url))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rates provider          {rates.url}  (RATES_API_URL)" in proc.stdout


def test_the_quay_mirrors_unapplied_storage_class_is_explained_as_the_replays_doing() -> None:
    """The replayed recording made quay's claim without a class, then the example asks for
    one: the demo showed Degraded=True(StorageClassImmutable) with no word on why."""
    from demo.world import _explained

    said = _explained({"type": "Degraded", "status": "True", "reason": "StorageClassImmutable",
                       "message": "PersistentVolumeClaim mirror-quay-cache has no storage "
                                  "class"}, local=True, explained=set())
    assert said is not None and "what it means: the replayed recording made this mirror's " \
        "claim without a storage class" in said
