"""Start and stop the real processes the tests drive (the router under gunicorn)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


class RouterProcess:
    """``python -m router`` under gunicorn on a free loopback port, as a subprocess."""

    def __init__(self, env: dict[str, str], workers: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
        full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"eventop-router-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", str(workers)],
            cwd=REPO, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_http(self.url + "/healthz", proc=self.proc)
        except Exception:
            self.stop()
            raise

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.log_path.unlink(missing_ok=True)
