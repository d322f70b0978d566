"""A small TCP proxy on 127.0.0.1 that can be cut and restored: a database outage for one study's
workers while the real PostgreSQL cluster (which other tests use) stays up.

    proxy = TcpProxy(5432); proxy.start()      # postgresql://...@127.0.0.1:{proxy.port}/db reaches the cluster
    proxy.cut()                                # every connection is reset, new ones are refused
    proxy.restore()                            # connections are accepted again (same port)
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forward 127.0.0.1:`port` (chosen free if 0) to 127.0.0.1:`target`."""

    def __init__(self, target: int, port: int = 0) -> None:
        self.target = target
        self.port = port
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()

    def start(self) -> None:
        """Listen (again) and forward every accepted connection."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
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
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
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
