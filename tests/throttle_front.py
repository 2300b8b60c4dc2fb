"""A loopback HTTP front that throttles: it answers a known share of an object
store's data requests itself, as a busy endpoint does (S3's 503 SlowDown,
Azure's 503 ServerBusy, GCS's 429), and passes everything else through.

Data requests are the ones that move a checkpoint's bytes: a GET with a Range
(S3, Azure, GCS media) and a PUT of a part, a block or a resumable upload's
chunk. Every `every`-th of them is throttled (a retry is a request like any
other), and the front counts what it did, to be compared with what the
clients say they saw.
"""
from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass

from loopback_proxy import LoopbackProxy, close_both, pump

#: the answer each store gives a request it will not take now
ANSWERS = {
    "s3": (503, "Slow Down", {"Content-Type": "application/xml"},
           b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
           b"<Message>Please reduce your request rate.</Message></Error>"),
    "az": (503, "Server Busy", {"Content-Type": "application/xml", "x-ms-error-code": "ServerBusy"},
           b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
           b"<Message>Ingress is over the account limit.</Message></Error>"),
    "gs": (429, "Too Many Requests", {"Content-Type": "application/json"},
           b'{"error": {"code": 429, "message": "The rate of change requests to the object is too high."}}'),
}
_PART = re.compile(rb"[?&](partNumber|comp=block|upload_id)=?", re.I)


@dataclass
class Counts:
    data_requests: int = 0
    throttled: int = 0
    throttled_gets: int = 0
    throttled_puts: int = 0


def is_data_request(method: bytes, target: bytes, headers: dict[bytes, bytes]) -> bool:
    if method == b"GET":
        return b"range" in headers or b"x-ms-range" in headers
    return method == b"PUT" and _PART.search(target) is not None


class ThrottleFront(LoopbackProxy):
    """Listens on a loopback port (`port`, or a free one), forwards to 127.0.0.1:target_port."""

    def __init__(self, target_port: int, every: int, store: str = "s3", port: int = 0) -> None:
        self.every, self.answer = every, ANSWERS[store]
        self.counts = Counts()
        self._lock = threading.Lock()
        super().__init__(target_port, port)

    def _throttle_next(self, method: bytes, target: bytes, headers: dict[bytes, bytes]) -> bool:
        if not is_data_request(method, target, headers):
            return False
        with self._lock:
            self.counts.data_requests += 1
            hit = self.counts.data_requests % self.every == 0
            if hit:
                self.counts.throttled += 1
                if method == b"GET":
                    self.counts.throttled_gets += 1
                else:
                    self.counts.throttled_puts += 1
            return hit

    def serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        incoming = client.makefile("rb")
        try:
            while True:
                head = _read_head(incoming)
                if head is None:
                    return
                method, target, headers, raw = head
                if self._throttle_next(method, target, headers):
                    if headers.get(b"expect", b"").lower() == b"100-continue":
                        # the client waits for a go-ahead it will not get: answer and end the connection
                        self._refuse(client, close=True)
                        return
                    _copy_body(incoming, headers, None)
                    self._refuse(client, close=False)
                    continue
                upstream.sendall(raw)
                _copy_body(incoming, headers, upstream)
        except OSError:
            pass
        finally:
            close_both(client, upstream)
            client.close()
            upstream.close()

    def _refuse(self, client: socket.socket, close: bool) -> None:
        status, reason, fields, body = self.answer
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Retry-After: 0",
                 *(f"{k}: {v}" for k, v in fields.items())]
        if close:
            lines.append("Connection: close")
        client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def _read_head(incoming) -> tuple[bytes, bytes, dict[bytes, bytes], bytes] | None:
    lines = []
    while True:
        line = incoming.readline(65536)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue
            break
        lines.append(line)
    method, target, _ = lines[0].split(b" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers, b"".join(lines) + b"\r\n"


def _copy_body(incoming, headers: dict[bytes, bytes], upstream: socket.socket | None) -> None:
    """The request's body, to upstream (or nowhere): by Content-Length, or chunked."""
    def copy(n: int) -> None:
        while n:
            data = incoming.read(min(n, 1 << 20))
            if not data:
                raise OSError("the client closed mid-body")
            if upstream is not None:
                upstream.sendall(data)
            n -= len(data)
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        while True:
            size_line = incoming.readline(1024)
            if upstream is not None:
                upstream.sendall(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            copy(size + 2)  # the chunk and its CRLF
            if size == 0:
                return  # (no trailers: the clients here send none)
    copy(int(headers.get(b"content-length", b"0")))
