"""A network partition between one client and the broker, on 127.0.0.1.

``ProxiedKafka`` is the embedded broker with a second listener, ``PROXIED``, which advertises
the port of a ``PartitionProxy`` instead of its own. A client bootstraps through the proxy;
the broker answers its metadata requests with the endpoints of the listener that took the
connection (KIP-103), so every later connection of that client - to the group and transaction
coordinators, to partition leaders - goes through the proxy too. Everyone else uses the
PLAINTEXT listener directly and is not affected by a cut.

``cut(drop=True)`` drops the traffic the way a partition does: open connections stay open but
nothing crosses them, new connections are accepted and hear nothing. ``cut(drop=False)``
refuses it instead (a firewall's REJECT): connections are reset, new ones closed at once.
``heal()`` closes whatever the cut stranded (as its peer would reset it once the network is
back) and forwards again.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from pathlib import Path

from broker.dev.kafka_local import LocalKafka, free_port


class ProxiedKafka(LocalKafka):
    """The embedded broker plus a ``PROXIED`` listener on ``listener_port``, advertised as
    ``127.0.0.1:proxy_port``."""

    def __init__(self, run_dir: Path, proxy_port: int) -> None:
        super().__init__(run_dir, heap="512m")
        self.proxy_port = proxy_port
        self.listener_port = 0

    def _properties(self, port: int, controller_port: int, data_dir: Path) -> str:
        self.listener_port = free_port()
        added = {
            "listeners=": f",PROXIED://127.0.0.1:{self.listener_port}",
            "advertised.listeners=": f",PROXIED://127.0.0.1:{self.proxy_port}",
            "listener.security.protocol.map=": ",PROXIED:PLAINTEXT",
        }
        lines = []
        for line in super()._properties(port, controller_port, data_dir).splitlines():
            key = line.split("=", 1)[0] + "="
            lines.append(line + added.get(key, ""))
        return "\n".join(lines) + "\n"


class PartitionProxy:
    """A TCP proxy from ``port`` (bound now, on 127.0.0.1) to ``upstream`` (set before the
    first connection), with one thread pair per connection."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.upstream = 0
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._generation = 0  # a heal ends every connection of the generations before it
        self._sockets: list[socket.socket] = []
        self._rejecting = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, *, drop: bool) -> None:
        """``drop``: packets are lost (a firewall's DROP) - connections stall until the heal;
        else they are refused (REJECT) - open connections are reset, new ones closed at once."""
        self.cuts += 1
        self._rejecting = not drop
        if drop:
            self._open.clear()
        else:
            self._end_connections()

    def heal(self) -> None:
        self._rejecting = False
        self._end_connections()
        self._open.set()

    def _end_connections(self) -> None:
        with self._lock:
            self._generation += 1
            stranded, self._sockets = self._sockets, []
        for sock in stranded:
            _close(sock)

    def close(self) -> None:
        _close(self._server)
        self.heal()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket, generation: int) -> bool:
        with self._lock:
            if generation != self._generation:
                return False
            self._sockets.append(sock)
            return True

    def _serve(self, client: socket.socket) -> None:
        generation = self._generation
        if self._rejecting or not self._track(client, generation):
            _close(client)
            return
        self._open.wait()  # cut: accepted, and nobody answers
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
            upstream.settimeout(None)
        except OSError:
            _close(client)
            return
        if not self._track(upstream, generation):
            _close(client)
            _close(upstream)
            return
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst, generation), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, generation: int) -> None:
        try:
            while True:
                self._open.wait()  # cut: the bytes stay where they are, unread
                if generation != self._generation:
                    return
                readable, _, _ = select.select([src], [], [], 0.2)  # blocking sockets: sendall waits
                if not readable:
                    continue
                data = src.recv(65536)
                if not data:
                    return
                # Read before a cut, delivered after a heal: never (a new generation).
                self._open.wait()
                if generation != self._generation:
                    return
                dst.sendall(data)
        except (OSError, ValueError):  # closed by a heal or by the other direction
            return
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
