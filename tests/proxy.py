"""A small TCP proxy on 127.0.0.1 that can be cut and restored: a database outage for one study's
workers while the real PostgreSQL cluster (which other tests use) stays up.

    proxy = TcpProxy(5432); proxy.start()      # postgresql://...@127.0.0.1:{proxy.port}/db reaches the cluster
    proxy.cut()                                # every connection is reset, new ones are refused
    proxy.restore()                            # connections are accepted again (same port)

With a `watch` (`tests.pg_faults.Watch`), what each client sends is read as PostgreSQL frontend
messages, and the watch may drop a connection right after it forwarded a COMMIT, before the
server's reply reaches the client (the commit happened; the client only sees the connection break).
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Any


class TcpProxy:
    """Forward 127.0.0.1:`port` (chosen free if 0) to 127.0.0.1:`target`."""

    def __init__(self, target: int, port: int = 0, host: str = "127.0.0.1", watch: Any = None) -> None:
        self.target = target
        self.port = port
        self.host = host  # the address to listen on (another host's side of a veth pair, say)
        self.watch = watch
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self.clients: dict[int, int] = {}  # upstream local port (the server's client_port) -> the client's own port

    def start(self) -> None:
        """Listen (again) and forward every accepted connection."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    restore = start

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            _close(listener)
        for c in conns:
            _close(c)  # shutdown first: it wakes the pump blocked in recv, which a bare close() would not

    stop = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._conns.update((client, upstream))
                self.clients[upstream.getsockname()[1]] = client.getpeername()[1]
            conn = self.watch.connection() if self.watch is not None else None
            for a, b, upward in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(a, b, conn, upward), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: Any = None, upward: bool = False) -> None:
        try:
            while data := src.recv(65536):
                if conn is not None and upward:
                    conn.sent(data)  # parsed before it is forwarded: a COMMIT marks the connection doomed first
                elif conn is not None and conn.doomed:
                    break  # the reply to the doomed COMMIT: swallowed, and the connection is dropped
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _close(s)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def in_front_of(url: str, watch: Any = None) -> tuple[TcpProxy, str]:
    """A started proxy in front of the database server of `url` (on 127.0.0.1), and `url` through it."""
    port = int(re.search(r"@127\.0\.0\.1:(\d+)/", url).group(1))
    proxy = TcpProxy(port, watch=watch)
    proxy.start()
    return proxy, url.replace(f"@127.0.0.1:{port}/", f"@127.0.0.1:{proxy.port}/")
