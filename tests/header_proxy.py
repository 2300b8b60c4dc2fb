"""A loopback TCP proxy in front of an S3 server that keeps each request's
request line and x-amz-content-sha256 header (bodies pass through unread)."""
from __future__ import annotations

import re
import socket
import threading

from s3_server import free_port

REQUEST = re.compile(rb"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.1\r\n((?:[^\r\n]+\r\n){0,60}?)\r\n")
SHA = re.compile(rb"^x-amz-content-sha256: *(\S+)\r$", re.I | re.M)
#: bytes of a stream kept between reads, so a request line split across two reads is seen
TAIL = 8192


class HeaderProxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.requests: list[tuple[str, str, str]] = []  # method, path, x-amz-content-sha256
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        tail = b""
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                if requests:
                    tail = self._scan(tail + data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _scan(self, data: bytes) -> bytes:
        end = 0
        for m in REQUEST.finditer(data):
            sha = SHA.search(m[3])
            with self._lock:
                self.requests.append((m[1].decode(), m[2].decode(), sha[1].decode() if sha else ""))
            end = m.end()
        return data[max(end, len(data) - TAIL):]

    def stop(self) -> None:
        self._listener.close()
