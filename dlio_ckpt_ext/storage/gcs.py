"""Google Cloud Storage (gs://BUCKET/PREFIX) through google-cloud-storage.

An object is one resumable upload: the SDK opens the session, and each chunk
the generator filled is sent as the session's next range (Content-Range)
straight from its buffer. GCS takes a session's chunks in order, one at a
time, so an object has one chunk uploading and one being filled; a rank's
concurrency comes from its files in flight (streaming.concurrent_files) and
its ranged reads. The object exists only once its last chunk arrived: a
failed or killed upload leaves nothing in the bucket (its session expires
after a week; GCS lists no sessions, so there is nothing for `status` to
find). Credentials as the SDK takes them: Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, the metadata server), or
with STORAGE_EMULATOR_HOST an emulator, anonymously.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator, Optional
from urllib.parse import quote

from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage.cloud import GCS_IN_FLIGHT, CloudBackend, CloudOptions
from dlio_ckpt_ext.storage.lent_blocks import LentBlockWriter
from dlio_ckpt_ext.storage.retries import COUNTS, THROTTLE_STATUS, send_with_retries

#: google-cloud-storage's DEFAULT_RETRY starts at 1 s, doubling
GCS_FIRST_BACKOFF_S = 1.0

#: every chunk of a resumable upload but the last is a multiple of this
CHUNK_ALIGN = 256 << 10


def storage_client():
    from google.cloud import storage
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials
        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                              credentials=AnonymousCredentials())
    import google.auth.exceptions
    try:
        return storage.Client()
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise StorageError(f"gs://: no Google Cloud credentials: set GOOGLE_APPLICATION_CREDENTIALS to a service "
                           f"account key file (or STORAGE_EMULATOR_HOST for an emulator); google-auth said: "
                           f"{str(exc).splitlines()[0]}") from None


def sdk_retry(opts: CloudOptions):
    """The SDK's own retry (its predicate: 408, 429, 5xx and transport errors)
    for the control calls (listings, deletes, markers), telling each retry."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.api_core.retry import Retry
    from google.cloud.storage.retry import DEFAULT_RETRY

    def note(exc: Exception) -> None:
        code = exc.code if isinstance(exc, GoogleAPICallError) else None
        COUNTS.add(throttled=code in THROTTLE_STATUS, retried=True)
    # Retry's other defaults are DEFAULT_RETRY's (60 s longest wait, doubling, 120 s in all)
    return Retry(predicate=DEFAULT_RETRY._predicate, initial=opts.retry_backoff_s or GCS_FIRST_BACKOFF_S,
                 on_error=note)


class ResumableWriter(LentBlockWriter):
    def __init__(self, backend: "GcsBackend", path: str, size: int) -> None:
        super().__init__(backend.uri(path), size, GCS_IN_FLIGHT, ordered=True, spare=backend.spare)
        self.backend, self.path = backend, path
        self.answer: dict = {}
        with backend.errors(path, "cannot start upload of"):
            self.session = backend.bucket.blob(backend.key(path)).create_resumable_upload_session(
                size=size, timeout=backend.timeout)

    def reserve(self, n: int) -> memoryview:
        if n % CHUNK_ALIGN and self._offset + n < self.size:
            raise StorageError(f"{self.uri}: chunks of {n} bytes: GCS takes a resumable upload's chunks in multiples "
                               f"of {CHUNK_ALIGN >> 10} KiB; set workload.streaming.chunk_size to a multiple of 1MiB")
        return super().reserve(n)

    def _put_range(self, first: int, data: memoryview):
        last = first + len(data) - 1
        span = f"bytes {first}-{last}/{self.size}" if len(data) else f"bytes */{self.size}"
        return self.backend.http.put(self.session, data=data, headers={"Content-Range": span},
                                     timeout=self.backend.timeout)

    def _answer(self, answer) -> dict:
        if answer.status_code == 308:
            return {}
        if answer.status_code in (200, 201):
            return answer.json()
        raise StorageError(f"cannot upload {self.uri}: HTTP {answer.status_code} {answer.text[:200]}")

    def send_block(self, index: int, offset: int, data: memoryview) -> None:
        # a chunk is sent again whole: GCS ignores the bytes of a range it already kept
        with self.backend.errors(self.path, "cannot upload"):
            self.answer = self._answer(self.backend.send(lambda: self._put_range(offset, data)))

    def finish(self, blocks: int) -> None:
        if self.size == 0:
            with self.backend.errors(self.path, "cannot complete upload of"):
                self.answer = self._answer(self.backend.send(lambda: self._put_range(0, memoryview(b""))))
        if int(self.answer.get("size", -1)) != self.size:
            raise StorageError(f"upload of {self.uri} stored {self.answer.get('size')} bytes, expected {self.size}")

    def discard(self) -> None:
        self.backend.http.delete(self.session, timeout=self.backend.timeout)  # GCS answers 499: cancelled


class GcsBackend(CloudBackend):
    scheme = "gs"

    def __init__(self, root: str, opts: CloudOptions) -> None:
        super().__init__(root, opts)
        import requests
        self.client = storage_client()
        self.bucket = self.client.bucket(self.container)
        self.endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or self.client._connection.API_BASE_URL
        # the JSON API's media links; the client's own authorised session sends the GETs
        self.media = f"{self.client._connection.API_BASE_URL}/download/storage/v1/b/{quote(self.container, safe='')}/o"
        self.timeout = (opts.connect_timeout_s, opts.operation_timeout_s)
        self.retry = sdk_retry(opts)
        # a session URI authorises its own chunks: a plain pooled session sends them
        self.http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=64)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)

    def send(self, request: Callable[[], "requests.Response"]) -> "requests.Response":
        """One of our own data requests (ranged GETs, resumable chunks: the SDK's
        retries do not cover them), retried on GCS's retryable answers and
        transport errors with exponential backoff, as GCS's guidance asks."""
        import requests
        return send_with_retries(request, lambda a: a.status_code, self.opts.max_attempts,
                                 self.opts.retry_backoff_s or GCS_FIRST_BACKOFF_S,
                                 (requests.ConnectionError, requests.Timeout))

    def classify(self, exc: BaseException) -> tuple[str, str]:
        import requests
        from google.api_core import exceptions as gexc
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, gexc.NotFound):
            return "missing", detail
        if isinstance(exc, (gexc.Unauthorized, gexc.Forbidden)):
            return "refused", detail
        if isinstance(exc, requests.ConnectionError):
            return "gone", detail
        return "", detail

    def _check_container(self) -> None:
        self.bucket.reload(timeout=self.timeout, retry=self.retry)

    def _sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        for blob in self.client.list_blobs(self.bucket, prefix=prefix, timeout=self.timeout, retry=self.retry):
            yield blob.name, blob.size

    def _names(self, prefix: str) -> Iterator[str]:
        listing = self.client.list_blobs(self.bucket, prefix=prefix, delimiter="/", timeout=self.timeout,
                                         retry=self.retry)
        for page in listing.pages:
            yield from (b.name for b in page)
            yield from page.prefixes

    def _delete(self, keys: list[str]) -> int:
        from google.api_core.exceptions import NotFound
        try:
            self.bucket.delete_blob(keys[0], timeout=self.timeout, retry=self.retry)
        except NotFound:
            return 0
        return 1

    def _put(self, key: str, data: bytes) -> None:
        self.bucket.blob(key).upload_from_string(data, timeout=self.timeout, retry=self.retry)

    def _get(self, key: str, offset: int = 0, length: Optional[int] = None) -> Optional[bytes]:
        """One ranged GET of the media link, its body read in one call: the SDK's
        own download (and requests' .content) read 8-10 KiB at a time in Python,
        which with several ranges in flight doubles the CPU per GiB (GIL)."""
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"} if length is not None else {}
        answer = self.send(lambda: self.client._http.get(f"{self.media}/{quote(key, safe='')}?alt=media",
                                                         headers=headers, timeout=self.timeout, stream=True))
        if answer.status_code == 404:
            return None
        if answer.status_code == 416:  # the object ends before offset: said by the caller
            return b""
        if answer.status_code not in (200, 206):
            from google.api_core.exceptions import from_http_response
            raise from_http_response(answer)
        with answer:  # in one read: requests' own .content reads 10 KiB at a time
            return answer.raw.read(decode_content=False)

    def _size(self, key: str) -> int:
        blob = self.bucket.get_blob(key, timeout=self.timeout, retry=self.retry)
        if blob is None:
            raise StorageError(f"missing checkpoint file gs://{self.container}/{key}")
        return blob.size

    def open_writer(self, path: str, size: int) -> ResumableWriter:
        return ResumableWriter(self, path, size)
