"""The image's entry points, run the way the image runs them, without a container engine.

The image is: a virtualenv holding exactly the runtime section of requirements.txt, plus
eventop as its wheel lays it out (``pyproject.toml`` maps each room of the repository to
``eventop.<room>``) without the local API server, run as ``python -m eventop.<component>``.
Here: a fresh virtualenv (no pip, nothing inherited) whose site-packages links exactly those
pinned distributions (taken from the project's virtualenv, versions checked against the pins,
so no network is needed) and eventop's packages at the places the wheel puts them. If the
router or the watcher imported a test-only package (pytest, requests-mock, the local API
server, ...) they would fail here as they would in the image.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.install.support import REPO, bare_venv, image_env
from tests.install.test_dockerfile import package_dirs


def runtime_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.startswith("# --- test and development"):
            break
        if re.fullmatch(r"[A-Za-z0-9_.-]+==[^ ]+", line):
            name, version = line.split("==")
            pins[name] = version
    return pins


@pytest.fixture(scope="module")
def image_like(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("image")
    python, site = bare_venv(root / "venv")
    for name, version in runtime_pins().items():
        dist = importlib.metadata.distribution(name)
        assert dist.version == version, (
            f"{name} {dist.version} is installed but requirements.txt pins {version}: "
            "reinstall the virtualenv (make test does)")
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            target = site / top
            if not target.exists():
                target.symlink_to(base / top)
    app = root / "app"
    app.mkdir()
    (site / "eventop").mkdir()
    for package, room in package_dirs().items():
        if room == "localkube":  # the Dockerfile removes it (checked there)
            continue
        target = site.joinpath(*package.split("."))
        if package == "eventop":
            for entry in (REPO / room).iterdir():
                (target / entry.name).symlink_to(entry)
        else:
            target.symlink_to(REPO / room, target_is_directory=True)
    # The image's own ENV, with /tmp standing for the pods' /tmp: an emptyDir, empty at start.
    tmp = root / "tmp"
    tmp.mkdir()
    env = {key: value.replace("/tmp", str(tmp), 1) if value.startswith("/tmp") else value
           for key, value in image_env().items() if key != "PATH"}
    # HOME as the image's user has it: a directory that does not exist (nothing may write there).
    env.update(PATH=f"{python.parent}:/usr/bin:/bin", HOME=str(root / "nonexistent"),
               TMPDIR=str(tmp), LANG="C.UTF-8")
    return {"python": str(python), "app": str(app), "env": env, "root": root}


def run(image: dict[str, Any], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([image["python"], "-m", *args], cwd=image["app"],
                          env={**image["env"], **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_image_environment_holds_no_test_tools(image_like: dict[str, Any]) -> None:
    probe = run(image_like, "pytest", "--version")
    assert probe.returncode != 0 and "No module named pytest" in probe.stderr
    for module in ("requests_mock", "kubernetes_validate", "eventop.localkube", "tests"):
        proc = subprocess.run([image_like["python"], "-c", f"import {module}"],
                              cwd=image_like["app"], env=image_like["env"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode != 0, f"{module} is importable in the image environment"


def test_watcher_help_runs_from_the_image_environment(image_like: dict[str, Any]) -> None:
    proc = run(image_like, "eventop.watcher", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "emit", "replay", "record"):
        assert command in proc.stdout
    assert run(image_like, "eventop.watcher", "run", "--help").returncode == 0


def test_router_help_runs_from_the_image_environment(image_like: dict[str, Any]) -> None:
    proc = run(image_like, "eventop.router", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "PORT" in proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_router_serves_on_port_from_the_environment(image_like: dict[str, Any],
                                                    local_kube: Any) -> None:
    """The image's default command (``python -m eventop.router``), PORT from the environment,
    multiprocess metrics in a directory it must create, against the local API server."""
    port = free_port()
    metrics = image_like["root"] / "tmp" / "metrics"
    proc = subprocess.Popen(
        [image_like["python"], "-m", "eventop.router", "--host", "127.0.0.1"],
        cwd=image_like["app"],
        env={**image_like["env"], "PORT": str(port), "WEB_CONCURRENCY": "2",
             "PROMETHEUS_MULTIPROC_DIR": str(metrics), "EVENTOP_KUBE_URL": local_kube.url},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        answers: dict[str, int] = {}
        deadline = time.monotonic() + 60
        # Until both answered 200: a server coming up between the two probes of one round
        # answers the second only.
        while (time.monotonic() < deadline and proc.poll() is None
               and answers != {"/healthz": 200, "/readyz": 200}):
            for path in ("/healthz", "/readyz"):
                with contextlib.suppress(requests.ConnectionError):
                    answers[path] = requests.get(f"http://127.0.0.1:{port}{path}",
                                                 timeout=5).status_code
            time.sleep(0.1)
        metrics_text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text \
            if proc.poll() is None else ""
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    assert answers == {"/healthz": 200, "/readyz": 200}, err[-3000:]
    assert metrics.is_dir()
    assert "eventop" in metrics_text
    assert proc.returncode == 0, f"router did not shut down cleanly on SIGTERM:\n{err[-3000:]}"


def test_image_venv_uses_this_python_minor_version(image_like: dict[str, Any]) -> None:
    proc = subprocess.run([image_like["python"], "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True, check=True, env=image_like["env"])
    assert proc.stdout.strip() == str(sys.version_info[:2]) == "(3, 11)", (
        "the Dockerfile's base image is Python 3.11")


