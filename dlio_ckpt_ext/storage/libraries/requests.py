"""Requests a client library sent, by kind, one tally a process: where the
library tells us (boto3's events: multi-storage-client's, and the bucket's
control plane every library backend shares) each one as it leaves, each
attempt; elsewhere from the library's own splitting of a call (a CRT upload's
8 MiB parts, minio's 32 MiB parts), which tests/test_client_libraries*.py
check against the server's own counters."""
from __future__ import annotations

import threading
from collections import Counter
from typing import Optional

#: S3's request kinds, as the server's metrics and our record name them
KINDS = ("PUT", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "AbortMultipartUpload",
         "GET", "HEAD", "LIST", "DELETE", "COPY")


class RequestCounts:
    """One tally a process, safe from every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def multipart(self, parts: int) -> None:
        """One multipart upload of `parts` parts: its three kinds of request."""
        with self._lock:
            self._counts.update({"CreateMultipartUpload": 1, "UploadPart": parts, "CompleteMultipartUpload": 1})

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: self._counts[k] for k in KINDS if self._counts[k]}


def request_kind(method: str, url: str, headers) -> str:
    """The S3 request an HTTP request is, by its method, query and headers."""
    query = url.partition("?")[2].split("&")
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in query else "DELETE" if "delete" in query \
            else "CompleteMultipartUpload"
    if method == "PUT":
        if "x-amz-copy-source" in {k.lower() for k in headers}:
            return "COPY"
        return "UploadPart" if any(q.startswith("uploadId=") for q in query) else "PUT"
    if method == "GET":
        listing = any(q.split("=")[0] in ("list-type", "prefix", "delimiter", "uploads") for q in query)
        return "LIST" if listing else "GET"
    if method == "DELETE":
        return "AbortMultipartUpload" if any(q.startswith("uploadId=") for q in query) else "DELETE"
    return method


#: this process's requests through a client library and the control plane beside it
PROCESS = RequestCounts()


class Boto3Retries:
    """What boto3's own retries did, every counted client of the process: attempts sent (each
    before-send) against API calls made (each before-call), and answers that throttled (429, 503).
    A call that still failed fails the run, said as its error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempts = self.calls = self.throttled = 0

    def add(self, attempts: int = 0, calls: int = 0, throttled: int = 0) -> None:
        with self._lock:
            self.attempts += attempts
            self.calls += calls
            self.throttled += throttled

    def snapshot(self) -> dict[str, int]:
        """In storage/retries.py's form."""
        with self._lock:
            return {"throttled": self.throttled, "retried": self.attempts - self.calls, "gave_up": 0}


BOTO3_RETRIES = Boto3Retries()
#: the statuses a store throttles with (storage/retries.py's)
THROTTLE_STATUS = frozenset({429, 503})


def count_boto3(client) -> None:
    """Count every request boto3 `client` sends from now on, and its retries (once a client,
    however often asked)."""
    events = client.meta.events
    events.register("before-send.s3", _sent, unique_id="dlio-ckpt-ext-request-count")
    events.register("before-call.s3", _called, unique_id="dlio-ckpt-ext-call-count")
    # first: the retry handler that decides stops the event's other handlers
    events.register_first("needs-retry.s3", _answered, unique_id="dlio-ckpt-ext-throttle-count")


def _sent(request, **_) -> None:
    PROCESS.add(request_kind(request.method, request.url, request.headers))
    BOTO3_RETRIES.add(attempts=1)


def _called(**_) -> None:
    BOTO3_RETRIES.add(calls=1)


def _answered(response=None, **_) -> None:
    if response is not None and response[0].status_code in THROTTLE_STATUS:
        BOTO3_RETRIES.add(throttled=1)


def since(before: Optional[dict], now: Optional[dict]) -> Optional[dict]:
    """The requests counted between two snapshots (None: not counted)."""
    if before is None or now is None:
        return None
    return {k: now[k] - before.get(k, 0) for k in now if now[k] - before.get(k, 0)}


def summed(tallies: list[Optional[dict]]) -> Optional[dict]:
    """Several ranks' or windows' requests by kind, added (None when none was counted)."""
    counted = [t for t in tallies if t is not None]
    if not counted:
        return None
    total: Counter = Counter()
    for t in counted:
        total.update(t)
    return {k: total[k] for k in KINDS if total[k]}


def parts(size: int, part_size: int) -> int:
    """Parts of an upload of `size` bytes (an empty one still sends one)."""
    return max(1, -(-size // part_size))
