"""Helpers for localkube's tests: raw HTTP calls, watch readers, recordings, objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[2]
NS_PATH = "/api/v1/namespaces"
RECORDINGS = REPO / "tests" / "recordings"


class Http:
    """Raw calls against one localkube, returning (status, parsed body)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def call(self, method: str, path: str, body: Any = None, *,
             content_type: str = "application/json",
             params: dict[str, str] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        resp = self.session.request(method, self.url + path, data=data, params=params,
                                    headers={"Content-Type": content_type}, timeout=10)
        return resp.status_code, (resp.json() if resp.content else None)

    def watch(self, path: str, **params: Any) -> list[dict[str, Any]]:
        """Every event of a watch that ends by itself (give timeoutSeconds)."""
        return [json.loads(line) for line in self.watch_lines(path, **params)]

    def watch_lines(self, path: str, **params: Any) -> list[bytes]:
        params = {"watch": "true", **{k: str(v) for k, v in params.items()}}
        with self.session.get(self.url + path, params=params, stream=True, timeout=10) as resp:
            assert resp.status_code == 200, resp.text
            return [line for line in resp.iter_lines() if line]

    def close(self) -> None:
        self.session.close()


def recording(name: str) -> Any:
    path = RECORDINGS / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def cm(name: str, namespace: str = "default", data: dict[str, str] | None = None,
       labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": data if data is not None else {"k": "v"}}


class RawWatch:
    """A watch read straight off the socket, so silence and abrupt ends are observable."""

    def __init__(self, url: str, path: str) -> None:
        import socket
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        self.buffer = b""

    def read(self, timeout: float) -> bytes:
        """Whatever arrives within ``timeout`` seconds (b"" on silence or a closed socket)."""

        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return b""
        self.buffer += data
        return data

    def read_until(self, marker: bytes, timeout: float = 5.0) -> bytes:
        """Read until ``marker`` has arrived (fails the test after ``timeout``)."""
        import time

        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            assert time.monotonic() < deadline, f"{marker!r} never arrived: {self.buffer!r}"
            if not self.read(0.2) and self.closed():
                raise AssertionError(f"connection closed before {marker!r}")
        return self.buffer

    def closed(self) -> bool:
        import select

        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        try:
            return self.sock.recv(1, 2) == b""  # MSG_PEEK
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def shape(value: Any) -> Any:
    """Structure without values: which keys exist, and list lengths (managedFields aside)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k != "managedFields"}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__
