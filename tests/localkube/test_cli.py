"""``python -m eventop.localkube``: its mistakes are one line, and it logs one line a request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]


def _localkube(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eventop.localkube", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("EVENTOP_")})


@pytest.mark.parametrize(("args", "said"), [
    (["--port", "99999"], "argument --port: expected an integer from 0 to 65535, not 99999"),
    (["--port", "http"], "argument --port: expected an integer from 0 to 65535, not 'http'"),
    (["--history", "0"], "argument --history: expected an integer of at least 1, not 0"),
    (["--crds", "/nonexistent/crds"],
     "--crds '/nonexistent/crds': no such directory (give a folder of CRD yaml files, or "
     "--crds '' for none)"),
    (["--log-format", "xml"], "argument --log-format: expected one of json, text, not 'xml'"),
])
def test_configuration_mistakes_are_one_line_and_exit_status_2(args: list[str],
                                                               said: str) -> None:
    proc = _localkube(*args)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("python -m eventop.localkube: error: ") and said in line


def test_a_crd_folder_with_a_broken_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [\n")
    proc = _localkube("--crds", str(tmp_path), "--port", "0")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m eventop.localkube: error: --crds {tmp_path}: cannot "
                           "install the CRDs: ")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_prints_its_url_then_logs_each_request(log_format: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "eventop.localkube", "--port", "0",
                             "--log-format", log_format], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert requests.get(f"{url}/api/v1/namespaces/default", timeout=10).ok
        assert requests.get(f"{url}/api/v1/namespaces/nope", timeout=10).status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = err.splitlines()
    if log_format == "json":
        messages = [json.loads(line)["message"] for line in lines]
    else:
        assert all(" INFO  eventop.localkube: " in line for line in lines), lines
        messages = [line.split("eventop.localkube: ", 1)[1] for line in lines]
    # The order is promised: "serving on" is logged before the URL is printed, and each
    # request is logged before it is answered (the next one is only sent after that).
    assert messages == [f"serving on {url} (CRDs: {REPO / 'crds'})",
                        "GET /api/v1/namespaces/default 200",
                        "GET /api/v1/namespaces/nope 404"]
