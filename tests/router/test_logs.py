"""What ``python -m eventop.router`` writes on stderr, read as a person or a collector would.

Every line is one JSON object (or, with ``--log-format text``, one text line), gunicorn's own
messages included: a malformed HTTP request or a shutdown must not add Python's
``--- Logging error ---`` blocks. The per-event line says what each handler returned.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from eventop.testing.processes import RouterProcess, free_port
from tests.router.support import binary, configmap, kube_event

MODULE = "tests.router.recording_handlers"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|"
                       r"CRITICAL) +[\w.]+: ")


def _router(tmp_path: Path, *args: str) -> RouterProcess:
    return RouterProcess({"EVENTOP_BUILTIN_HANDLERS": "none", "EVENTOP_HANDLERS": MODULE,
                          "EVENTOP_TEST_RECORD": str(tmp_path / "received.jsonl"),
                          "EVENTOP_KUBE_URL": f"http://127.0.0.1:{free_port()}"},
                         workers=1, log_dir=str(tmp_path), extra_args=list(args))


def _malformed_requests(port: int) -> None:
    """Bytes that are not HTTP, and a header gunicorn refuses: each answered 400."""
    for payload in (b"GARBAGE\r\n\r\n",
                    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(payload)
            assert conn.recv(100).startswith(b"HTTP/1.1 400")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_every_line_has_the_chosen_format_through_bad_requests_and_shutdown(
        tmp_path: Path, log_format: str) -> None:
    router = _router(tmp_path, "--log-format", log_format)
    try:
        obj = configmap("settings", "team-a", uid="u1", resource_version="4")
        headers, body = binary(kube_event("update", obj))
        assert requests.post(router.url, headers=headers, data=body, timeout=30).ok
        _malformed_requests(router.port)
    finally:
        router.stop(keep_log=True)
    lines = router.log().splitlines()
    assert "Logging error" not in router.log()
    if log_format == "json":
        parsed = [json.loads(line) for line in lines]  # fails on any line that is not JSON
        messages = [p["message"] for p in parsed]
    else:
        assert [line for line in lines if not TEXT_LINE.match(line)] == []
        messages = [TEXT_LINE.sub("", line) for line in lines]
    assert any(m.startswith("Invalid request from ip=127.0.0.1") for m in messages)
    assert "Shutting down: Master" in messages
    [event_line] = [m for m in messages if m.startswith("update ConfigMap team-a/settings")]
    assert re.fullmatch(r"update ConfigMap team-a/settings: "
                        rf"{re.escape(MODULE)}\.configmaps: recorded by configmaps "
                        r"\(200 in [\d.]+ ms\)", event_line)


def test_the_event_line_carries_each_handlers_result_as_a_field(tmp_path: Path) -> None:
    router = _router(tmp_path)
    try:
        obj = configmap("db", "team-b", data={"password": "never-logged"}, uid="u2",
                        resource_version="9")
        headers, body = binary(kube_event("add", obj))
        assert requests.post(router.url, headers=headers, data=body, timeout=30).ok
    finally:
        router.stop(keep_log=True)
    [line] = [json.loads(x) for x in router.log().splitlines() if '"u2/9/add"' in x]
    assert line["results"] == [{"handler": f"{MODULE}.configmaps", "outcome": "ok",
                                "detail": "recorded by configmaps"}]
    assert (line["kind"], line["namespace"], line["name"], line["status"]) == (
        "ConfigMap", "team-b", "db", 200)
    assert "never-logged" not in router.log()


def test_python_warnings_are_lines_and_the_insecure_tls_warning_comes_once(
        tmp_path: Path) -> None:
    """A kubeconfig with insecure-skip-tls-verify made urllib3 warn on every request."""
    code = """
import warnings
from urllib3.exceptions import InsecureRequestWarning
from eventop.router import logs
logs.configure("info", force=True, log_format="json")
for _ in range(3):
    warnings.warn("Unverified HTTPS request is being made to host '10.0.0.1'",
                  InsecureRequestWarning, stacklevel=1)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 1 and lines[0]["logger"] == "py.warnings"
    assert "InsecureRequestWarning: Unverified HTTPS request" in lines[0]["message"]
