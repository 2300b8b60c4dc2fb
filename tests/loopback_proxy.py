"""What the tests' loopback proxies share: a listener on a free port whose
every connection is handed to the proxy's own `serve`, and the byte pump."""
from __future__ import annotations

import socket
import threading
from typing import Callable, Optional

from s3_server import free_port


class LoopbackProxy:
    """Listens on 127.0.0.1 (on `port`, or a free one) in front of 127.0.0.1:target_port."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = port or free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._listener.close()

    def serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()


def close_both(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(src: socket.socket, dst: socket.socket, seen: Optional[Callable[[bytes], None]] = None) -> None:
    """Copy src to dst until either ends (seen: told of every piece), then end both."""
    try:
        while data := src.recv(1 << 20):
            dst.sendall(data)
            if seen is not None:
                seen(data)
    except OSError:
        pass
    finally:
        close_both(src, dst)
