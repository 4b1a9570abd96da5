"""The node proxy as it runs: the DaemonSet's own start script and nginx config, run by a
real nginx (Debian's nginx-light with its stream module), resolving the registry's Service
through a DNS server this test plays. No kubelet runs here, so this is where the proxy is
seen to follow a Service made again with a new ClusterIP.

Needs nginx with the stream module and the DNS port (53: a resolv.conf names no port);
skipped without them (``.ci/run`` installs nginx-light and libnginx-mod-stream).
"""

from __future__ import annotations

import shutil
import socket
import socketserver
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventop.handlers.mirrors import build
from eventop.testing.processes import free_port
from eventop.testing.waiting import wait_until
from tests.mirrors.support import container, env_of

STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")
NS = "registry-mirrors"
SEARCH = f"{NS}.svc.cluster.test"  # not cluster.local: the proxy assumes no domain


class Dns(socketserver.BaseRequestHandler):
    """Answers A queries for the names in ``server.records`` (TTL 0), nothing else."""

    def handle(self) -> None:
        data, sock = self.request
        header, question = data[:12], data[12:]
        labels, i = [], 0
        while question[i]:
            labels.append(question[i + 1:i + 1 + question[i]].decode())
            i += 1 + question[i]
        qtype = struct.unpack("!H", question[i + 1:i + 3])[0]
        name = ".".join(labels)
        ip = self.server.records.get(name) if qtype == 1 else None  # type: ignore[attr-defined]
        self.server.asked.append(name)  # type: ignore[attr-defined]
        answer = (struct.pack("!HHHLH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(ip)) if ip else b""
        reply = header[:2] + struct.pack("!HHHHH", 0x8180, 1, 1 if ip else 0, 0, 0)
        sock.sendto(reply + question[:i + 5] + answer, self.client_address)


def registry(address: str, port: int, says: bytes) -> socketserver.TCPServer:
    """A stand-in registry: answers every connection with ``says``."""
    class Say(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(says)

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True  # the last run's connections may linger in TIME_WAIT
        daemon_threads = True

    server = Server((address, port), Say)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def dns() -> Iterator[socketserver.UDPServer]:
    if shutil.which("nginx") is None or not STREAM_MODULE.exists():
        pytest.skip("nginx with its stream module not installed")
    try:
        server = socketserver.ThreadingUDPServer(("127.0.0.1", 53), Dns)
    except OSError as exc:
        pytest.skip(f"cannot serve DNS on 127.0.0.1:53: {exc}")
    server.records, server.asked = {}, []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def fetch(port: int) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
            return conn.recv(100)
    except OSError:
        return b""


def node_proxy() -> dict:
    """The DaemonSet of a mirror ``hub``."""
    mirror = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
              "metadata": {"name": "hub", "namespace": NS, "uid": "u-1"},
              "spec": {"upstream": "https://registry-1.docker.io"}}
    return build.daemonset(mirror, build.parse_spec(mirror))


def test_the_node_proxy_follows_the_services_new_cluster_ip(
        dns: socketserver.UDPServer, tmp_path: Path) -> None:
    ds = node_proxy()
    script = container(ds)["command"][2]
    listen = free_port()
    conf = (env_of(ds)["NGINX_CONF"]["value"]
            .replace(f"listen {build.PROXY_PORT};", f"listen 127.0.0.1:{listen};"))
    # Debian builds the stream module as a module (the nginx image has it built in); this
    # test's files go under tmp_path, not /tmp
    conf = f"load_module {STREAM_MODULE};\n" + conf.replace("/tmp/", f"{tmp_path}/")
    script = script.replace("/tmp/", f"{tmp_path}/")
    (tmp_path / "resolv.conf").write_text(
        f"search {SEARCH} svc.cluster.test cluster.test\nnameserver 127.0.0.1\noptions ndots:5\n")
    name = f"mirror-hub.{SEARCH}"
    port = build.REGISTRY_PORT
    old, new = registry("127.0.0.2", port, b"old"), registry("127.0.0.3", port, b"new")
    dns.records[name] = "127.0.0.2"  # type: ignore[attr-defined]
    proxy = subprocess.Popen(["/bin/sh", "-c", script], env={
        "PATH": "/usr/sbin:/usr/bin:/bin", "NGINX_CONF": conf,
        "RESOLV_CONF": str(tmp_path / "resolv.conf")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: fetch(listen) == b"old", 15, 0.2), proxy.stdout  # type: ignore
        assert name in dns.asked  # type: ignore[attr-defined]
        dns.records[name] = "127.0.0.3"  # the Service made again  # type: ignore
        assert wait_until(lambda: fetch(listen) == b"new", 30, 0.2), "the proxy kept the old IP"
    finally:
        proxy.terminate()
        proxy.wait(10)
        old.shutdown()
        new.shutdown()
        old.server_close()
        new.server_close()


def test_a_pod_without_a_search_line_says_why_the_proxy_cannot_start(tmp_path: Path) -> None:
    ds = node_proxy()
    (tmp_path / "resolv.conf").write_text("nameserver 10.96.0.10\n")
    proc = subprocess.run(["/bin/sh", "-c", container(ds)["command"][2]], env={
        "PATH": "/usr/sbin:/usr/bin:/bin", "NGINX_CONF": "x",
        "RESOLV_CONF": str(tmp_path / "resolv.conf")}, capture_output=True, text=True,
        timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"{tmp_path}/resolv.conf has no nameserver or no search "
                                   "line: cannot resolve the registry")
