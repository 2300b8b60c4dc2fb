"""A loopback TCP proxy in front of an S3 server that keeps each request's
request line and x-amz-content-sha256 header (bodies pass through unread)."""
from __future__ import annotations

import re
import socket
import threading

from loopback_proxy import LoopbackProxy, pump

REQUEST = re.compile(rb"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.1\r\n((?:[^\r\n]+\r\n){0,60}?)\r\n")
SHA = re.compile(rb"^x-amz-content-sha256: *(\S+)\r$", re.I | re.M)
#: bytes of a stream kept between reads, so a request line split across two reads is seen
TAIL = 8192


class HeaderProxy(LoopbackProxy):
    def __init__(self, target_port: int) -> None:
        self.requests: list[tuple[str, str, str]] = []  # method, path, x-amz-content-sha256
        self._lock = threading.Lock()
        super().__init__(target_port)

    def serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.target)
        tail = b""

        def scan(data: bytes) -> None:
            nonlocal tail
            tail = self._scan(tail + data)
        threading.Thread(target=pump, args=(client, server, scan), daemon=True).start()
        threading.Thread(target=pump, args=(server, client), daemon=True).start()

    def _scan(self, data: bytes) -> bytes:
        end = 0
        for m in REQUEST.finditer(data):
            sha = SHA.search(m[3])
            with self._lock:
                self.requests.append((m[1].decode(), m[2].decode(), sha[1].decode() if sha else ""))
            end = m.end()
        return data[max(end, len(data) - TAIL):]
