"""A TCP proxy on loopback that misbehaves on demand, for network faults between two processes.

Put it between the watcher and the API server (the watcher's kubeconfig names the proxy's
port; TLS passes through untouched) and it can:

* :meth:`TcpProxy.freeze` the connections open now: bytes stop flowing both ways while the
  sockets stay open, the way a middlebox that lost its state (or a half-dead peer) looks to
  a client: no FIN, no RST, just silence. New connections are forwarded normally;
* :meth:`TcpProxy.drop` connections: closed with an RST (SO_LINGER 0), mid-stream;
* :meth:`TcpProxy.chaos`: drop one random live connection every so often until stopped;
* :meth:`TcpProxy.refuse` new connections (accepted and reset at once) while ``True``.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import threading
import time


class _Pipe:
    """One proxied connection: the client's socket and ours to the target."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.frozen = False
        self.closed = False
        self.opened = time.monotonic()

    def close(self, reset: bool = False) -> None:
        self.closed = True
        for s in (self.client, self.upstream):
            if reset:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.close()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._pipes: list[_Pipe] = []
        self._lock = threading.Lock()
        self._refusing = False
        self._closed = False
        self._chaos_stop: threading.Event | None = None
        self.accepted = 0
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True, name="tcpproxy-accept").start()

    # -- plumbing --------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                _Pipe(client, socket.socket()).close(reset=True)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _Pipe(client, socket.socket()).close(reset=True)
                continue
            pipe = _Pipe(client, upstream)
            with self._lock:
                self._pipes.append(pipe)
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pipe, src, dst), daemon=True).start()

    def _pump(self, pipe: _Pipe, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not pipe.closed:
                if pipe.frozen:  # not reading: the peer's bytes pile up in kernel buffers
                    time.sleep(0.05)
                    continue
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready or pipe.frozen:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if not pipe.frozen:
                pipe.close()
            with self._lock:
                if pipe.closed and pipe in self._pipes:
                    self._pipes.remove(pipe)

    def live(self) -> list[_Pipe]:
        with self._lock:
            return [p for p in self._pipes if not p.closed and not p.frozen]

    # -- faults ------------------------------------------------------------------------

    def freeze(self) -> int:
        """Silence every connection open now (sockets stay open); returns how many."""
        with self._lock:
            pipes = [p for p in self._pipes if not p.closed]
        for p in pipes:
            p.frozen = True
        return len(pipes)

    def drop(self, count: int | None = None) -> int:
        """Reset ``count`` random live connections (all when None); returns how many."""
        pipes = self.live()
        if count is not None:
            pipes = random.sample(pipes, min(count, len(pipes)))
        for p in pipes:
            p.close(reset=True)
        with self._lock:
            self.dropped += len(pipes)
            self._pipes = [p for p in self._pipes if not p.closed]
        return len(pipes)

    def refuse(self, refusing: bool) -> None:
        self._refusing = refusing

    def chaos(self, every: float) -> None:
        """Drop one random live connection every ``every`` seconds until :meth:`calm`."""
        stop = self._chaos_stop = threading.Event()

        def run() -> None:
            while not stop.wait(random.uniform(every / 2, every * 1.5)):
                self.drop(1)
        threading.Thread(target=run, daemon=True, name="tcpproxy-chaos").start()

    def calm(self) -> None:
        if self._chaos_stop is not None:
            self._chaos_stop.set()

    def close(self) -> None:
        self.calm()
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pipes, self._pipes = self._pipes, []
        for p in pipes:
            p.close()
