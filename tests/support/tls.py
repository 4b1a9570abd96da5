"""A small HTTPS server on loopback with a throwaway certificate, counting its connections.

For tests of how eventop's Kubernetes client sets up TLS: the certificate is made with the
``openssl`` command (which the cluster suite needs anyway), for ``IP:127.0.0.1`` only, so a
client that checks hostnames must refuse ``localhost``.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


@dataclass
class TLSServer:
    port: int
    ca: Path  # the self-signed certificate, to trust
    connections: list[int]  # one entry per accepted TLS connection

    def url(self, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}"


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate and key for IP:127.0.0.1 (EC P-256, valid one day)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


class _Version(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b'{"gitVersion": "v1.24.0-test"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # a sink taking an event
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def tls_server(directory: Path) -> Iterator[TLSServer]:
    """Answers every GET with a /version body and every POST with 200, over TLS."""
    cert, key = self_signed(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    connections: list[int] = []

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):  # type: ignore[no-untyped-def]
            sock, address = super().get_request()
            connections.append(1)
            return context.wrap_socket(sock, server_side=True), address

    server = Server(("127.0.0.1", 0), _Version)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TLSServer(server.server_address[1], cert, connections)
    finally:
        server.shutdown()
        server.server_close()
