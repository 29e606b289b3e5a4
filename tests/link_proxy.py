"""A TCP proxy on a free loopback port for fault tests: it forwards bytes to a target with added
latency, or, once partitioned, swallows them (a blackhole: connections stay open, nothing arrives,
so callers see timeouts, not refusals).

    with LinkProxy(server.port, delay_s=0.02) as link:  # link.address instead of the server's
        ...
        link.partition()
"""

from __future__ import annotations

import socket
import threading
import time

HOST = "127.0.0.1"
CHUNK_BYTES = 65536


class LinkProxy:
    def __init__(self, target_port: int, delay_s: float = 0.0):
        self.target_port = target_port
        self.delay_s = delay_s  # added to each chunk of bytes, each direction
        self.partitioned = threading.Event()
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="link-proxy", daemon=True).start()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def partition(self) -> None:
        """From now on every byte either way is dropped."""
        self.partitioned.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection((HOST, self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(CHUNK_BYTES)
            except OSError:
                return
            if not data:
                if not self.partitioned.is_set():
                    _close(sink)
                return
            if self.partitioned.is_set():
                continue
            if self.delay_s:
                time.sleep(self.delay_s)
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
