"""Megatron-LM's and NeMo's client: NVIDIA's multi-storage-client (msc://,
over boto3). A file opened for writing is buffered whole in memory and
uploaded on close: one PUT up to 64 MiB, else 32 MiB parts, 8 at once. A
file opened for reading is fetched whole on open up to 512 MiB (HEADs, then
one GET or 32 MiB ranged GETs), past that one ranged GET a read(). Every
request is counted as boto3 sends it (its before-send event, each attempt)."""
from __future__ import annotations

import os
import threading
from typing import Iterator, Optional

from dlio_ckpt_ext.engine.storage_interface import Reader, Writer
from dlio_ckpt_ext.storage.libraries.library_backend import LibraryBackend
from dlio_ckpt_ext.storage.libraries.requests import BOTO3_RETRIES, count_boto3
from dlio_ckpt_ext.storage.ranged_reader import PlannedRangeReader

PROFILE = "ckpt"
#: multi-storage-client's S3 provider defaults (providers/s3.py) and ObjectFile's memory_load_limit
MULTIPART_THRESHOLD, MULTIPART_CHUNKSIZE, MAX_CONCURRENCY = 64 << 20, 32 << 20, 8
MEMORY_LOAD_LIMIT = 512 << 20


class MscWriter(Writer):
    def __init__(self, backend: "MscBackend", path: str, size: int) -> None:
        self.backend, self.uri = backend, backend.uri(path)
        with backend.errors(self.uri, "cannot open"):
            self.file = backend.client().open(backend.key(path), "wb")

    def write(self, data: memoryview) -> None:
        self.file.write(data)  # into its in-memory file: the whole file is held until close

    def close(self) -> None:
        with self.backend.errors(self.uri, "cannot upload"):
            self.file.close()

    def abort(self) -> None:
        # its close() would upload what it holds: drop the buffer instead (a closed buffer, no upload)
        self.file._file.close()


class MscReader(PlannedRangeReader):
    """One file opened as Megatron opens it: fetched on open, then read from the library's copy."""

    def __init__(self, backend: "MscBackend", path: str, size: Optional[int]) -> None:
        self.backend, self.key, self._file, self._lock = backend, backend.key(path), None, threading.Lock()
        uri = backend.uri(path)

        def get_range(offset: int, length: int) -> bytes:
            with backend.errors(uri, "cannot read"), self._lock:
                if self._file is None:
                    self._file = backend.client().open(self.key, "rb")
                self._file.seek(offset)
                return self._file.read(length)

        def stat() -> int:
            with backend.errors(uri, "cannot stat"):
                return backend.head(self.key)
        super().__init__(uri, size, get_range, stat, probe=False)

    def close(self) -> None:
        super().close()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class MscBackend(LibraryBackend):
    library = "msc"
    write_cache_method = "none needed: a save ends when each file's upload completed"
    read_cache_method = ("none needed: multi-storage-client's cache is off; a file read is fetched from the "
                         "object server when opened")

    def make_client(self):
        import multistorageclient as msc
        profile = {"storage_provider": {"type": "s3", "options": {
            "base_path": self.bucket, "region_name": self.region,
            **({"endpoint_url": self.endpoint} if self.endpoint else {})}}}
        if os.environ.get("AWS_ACCESS_KEY_ID"):
            profile["credentials_provider"] = {"type": "S3Credentials", "options": {
                "access_key": os.environ["AWS_ACCESS_KEY_ID"], "secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY", "")}}
        client = msc.StorageClient(msc.StorageClientConfig.from_dict({"profiles": {PROFILE: profile}}, profile=PROFILE))
        count_boto3(client._storage_provider._s3_client)
        return client

    def missing(self, exc: BaseException) -> bool:
        return isinstance(exc, FileNotFoundError) or "NoSuchKey" in str(exc) or "Not Found" in str(exc)

    def open_writer(self, path: str, size: int) -> Writer:
        return MscWriter(self, path, size)

    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        return MscReader(self, path, size)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        from multistorageclient.types import Range
        return self.client().read(key, byte_range=Range(offset=offset, size=length))

    def head(self, key: str) -> int:
        return self.client().info(key).content_length

    def get_whole(self, key: str) -> Optional[bytes]:
        try:
            return self.client().read(key)
        except Exception as exc:  # noqa: BLE001 - FileNotFoundError, or botocore's NoSuchKey
            if self.missing(exc):
                return None
            raise

    def list_names(self, prefix: str) -> Iterator[str]:
        # StorageClient.list with its folders: one delimiter listing, as Megatron's checks of a folder go
        return (o.key for o in self.client().list(prefix, include_directories=True))

    def write_concurrency(self, chunk_size: int) -> dict:
        return {"requests_in_flight": MAX_CONCURRENCY, "request_bytes": MULTIPART_CHUNKSIZE,
                "note": "each file held whole in memory, then one PUT up to 64 MiB or 32 MiB parts"}

    def read_concurrency(self, requests_in_flight: int, request_bytes: int) -> dict:
        return {"requests_in_flight": MAX_CONCURRENCY, "request_bytes": MULTIPART_CHUNKSIZE,
                "note": "each file fetched whole as it is opened, up to 512 MiB: one GET up to 64 MiB, "
                        "else 32 MiB ranged GETs; a larger file one ranged GET a read"}

    def retry_counts(self) -> Optional[dict]:
        """boto3's retries and throttles: every request of this library (and the control plane's) goes
        through it. A retry multi-storage-client makes itself, after boto3 gave up, is a new call."""
        return BOTO3_RETRIES.snapshot()

    def describe(self) -> dict:
        return {**super().describe(), "retries_counted": True}

    def settings(self) -> dict:
        return {"multipart_threshold": MULTIPART_THRESHOLD, "part_size": MULTIPART_CHUNKSIZE,
                "max_concurrency": MAX_CONCURRENCY, "memory_load_limit": MEMORY_LOAD_LIMIT,
                "files_at_once": 1, "holds_whole_files": True}


BACKEND = MscBackend
