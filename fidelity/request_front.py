"""A recording front for an S3 server: a loopback proxy that passes every byte
through unchanged and keeps, for each request, what the server saw of it:
the method, the object, the kind of S3 request, its size (a body's decoded
length, a GET's range), its conditional headers (If-Match, If-None-Match, a
copy's source), its answer's status, and how many requests were in flight
when it started (sent and not yet answered in full).

fidelity/record_requests.py records the real libraries' saves through it and
tests/test_fidelity.py our runs through the same client, and both reduce the
records with `summary`. Standard library only (the fidelity venv and ours
both import it). HTTP/1.1 without pipelining, as every S3 client sends it."""
from __future__ import annotations

import re
import socket
import threading
from collections import Counter
from typing import Optional
from urllib.parse import parse_qsl, unquote, urlsplit

_HEAD_END = b"\r\n\r\n"


def request_kind(method: str, query: dict, headers: dict) -> str:
    """The S3 request, by method, query and headers."""
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in query else "DeleteObjects" if "delete" in query \
            else "CompleteMultipartUpload"
    if method == "PUT":
        if "x-amz-copy-source" in headers:
            return "CopyObject"
        return "UploadPart" if "uploadId" in query else "PutObject"
    if method == "GET":
        if "list-type" in query or "prefix" in query or "delimiter" in query:
            return "ListObjects"
        return "ListMultipartUploads" if "uploads" in query else "GetObject"
    if method == "HEAD":
        return "HeadObject"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return method


def _headers(head: bytes) -> tuple[str, dict]:
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}


class _Body:
    """How much of a message's body is still to come: Content-Length bytes, or chunked."""

    def __init__(self, headers: dict, has_body: bool = True) -> None:
        self.chunked = has_body and "chunked" in headers.get("transfer-encoding", "").lower()
        self.left = int(headers.get("content-length", 0) or 0) if has_body and not self.chunked else 0
        self.line = b""      # a chunk-size line being read
        self.trailer = False  # past the last chunk: reading its trailer to the empty line

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        """Consume body bytes; (whether the body ended, the bytes after it)."""
        while True:
            if not self.chunked:
                take = min(self.left, len(data))
                self.left -= take
                return self.left == 0, data[take:]
            if self.left:
                take = min(self.left, len(data))
                self.left -= take
                data = data[take:]
                if self.left:
                    return False, b""
            end = data.find(b"\r\n")
            if end < 0:
                self.line += data
                return False, b""
            line, data = self.line + data[:end], data[end + 2:]
            self.line = b""
            if self.trailer:
                if not line:
                    return True, data
                continue
            if not line:  # the CRLF closing a chunk's data
                continue
            size = int(line.split(b";")[0], 16)
            if size == 0:
                self.trailer = True
            else:
                self.left = size


def _message_head(buf: bytes):
    """A parser's wait for a message's head; (its first line, its headers, the bytes after it)."""
    while _HEAD_END not in buf:
        buf += yield
    head, buf = buf.split(_HEAD_END, 1)
    return (*_headers(head), buf)


def _through(body: _Body, buf: bytes):
    """A parser's wait for the end of a body (the bytes given it first, then each read); the bytes after it."""
    done, buf = body.feed(buf)
    while not done:
        done, buf = body.feed((yield))
    return buf


class RequestFront:
    """Listens on a free loopback port (`port`), forwards to 127.0.0.1:target_port, records requests."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.records: list[dict] = []
        self.in_flight = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="request-front").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            waiting: list[dict] = []  # this connection's requests sent and not answered, oldest first
            threading.Thread(target=self._pump, args=(client, server, self._requests(waiting)), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self._answers(waiting)), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, parse) -> None:
        next(parse)
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                # parsed before it is forwarded: a request is waiting for its answer before the server
                # can answer it (a HEAD's answer read as another's would take the next answer as its body)
                parse.send(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _requests(self, waiting: list[dict]):
        buf = b""
        while True:
            line, headers, buf = yield from _message_head(buf)
            method, target, _ = line.split(" ", 2)
            url = urlsplit(target)
            query = dict(parse_qsl(url.query, keep_blank_values=True))
            size = int(headers.get("x-amz-decoded-content-length") or headers.get("content-length") or 0)
            rng = re.match(r"bytes=(\d+)-(\d*)", headers.get("range", ""))
            record = {"method": method, "path": unquote(url.path), "kind": request_kind(method, query, headers),
                      "size": size, "range": [int(rng[1]), int(rng[2]) if rng[2] else None] if rng else None,
                      "if_match": headers.get("if-match"), "if_none_match": headers.get("if-none-match"),
                      "copy_source": unquote(headers["x-amz-copy-source"]) if "x-amz-copy-source" in headers
                      else None, "status": None}
            with self._lock:
                self.in_flight += 1
                record["in_flight"] = self.in_flight
                self.records.append(record)
                waiting.append(record)
            buf = yield from _through(_Body(headers), buf)

    def _answers(self, waiting: list[dict]):
        buf = b""
        while True:
            line, headers, buf = yield from _message_head(buf)
            status = int(line.split(" ", 2)[1])
            if 100 <= status < 200:  # 100 Continue: the answer is still to come
                continue
            record = waiting.pop(0) if waiting else {"method": "?"}
            buf = yield from _through(_Body(headers, record["method"] != "HEAD" and status not in (204, 304)), buf)
            with self._lock:
                record["status"] = status
                self.in_flight -= 1

    def stop(self) -> None:
        self._sock.close()


def summary(records: list[dict], prefix: str, normalise=lambda name: name, skip=lambda record, name: False) -> dict:
    """What the requests below `prefix` ("/bucket/key-prefix/") show: counts by kind, the sizes of
    parts, single PUTs and ranged GETs, the conditional requests and writes, the bytes written to each
    (normalised) name, and the most in flight.
    skip(record, name): requests left out (a run's own bookkeeping beside the save)."""
    mine = [r for r in records if (r["path"].startswith(prefix) or r["path"] == prefix.rstrip("/"))
            and not skip(r, r["path"][len(prefix):])]
    objects, written = Counter(), Counter()
    for r in mine:
        objects[(r["kind"], normalise(r["path"][len(prefix):]))] += 1
        if r["kind"] in ("PutObject", "UploadPart"):
            written[normalise(r["path"][len(prefix):])] += r["size"]

    def sizes(kind: str) -> dict:
        return dict(sorted(Counter(str(r["size"]) for r in mine if r["kind"] == kind).items()))

    gets = Counter(str(r["range"][1] - r["range"][0] + 1) if r["range"] and r["range"][1] is not None else "whole"
                   for r in mine if r["kind"] == "GetObject")
    return {"by_kind": dict(sorted(Counter(r["kind"] for r in mine).items())),
            "upload_part_sizes": sizes("UploadPart"), "put_sizes": sizes("PutObject"),
            "get_sizes": dict(sorted(gets.items())),
            "conditional": dict(sorted(Counter(
                "if_none_match" if r["if_none_match"] else "if_match" for r in mine
                if r["if_match"] or r["if_none_match"]).items())),
            "copies": sorted(f"{normalise(r['copy_source'].split(prefix, 1)[-1])} -> "
                             f"{normalise(r['path'][len(prefix):])}" for r in mine if r["copy_source"]),
            "max_in_flight": max((r["in_flight"] for r in mine), default=0),
            "objects": [f"{kind} {name} x{n}" for (kind, name), n in sorted(objects.items())],
            "conditional_writes": [f"{kind} {name} {which} x{n}" for (kind, name, which), n in sorted(Counter(
                (r["kind"], normalise(r["path"][len(prefix):]), "if_none_match" if r["if_none_match"] else "if_match")
                for r in mine if r["method"] == "PUT" and (r["if_match"] or r["if_none_match"])).items())],
            "written": dict(sorted(written.items())),
            "failed": sum(1 for r in mine if (r["status"] or 0) >= 400)}


def front_for(endpoint: str) -> Optional[RequestFront]:
    """A front before the server at `endpoint` (http://127.0.0.1:PORT)."""
    return RequestFront(int(endpoint.rsplit(":", 1)[1].rstrip("/")))
