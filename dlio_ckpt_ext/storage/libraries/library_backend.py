"""What every client library's backend shares: an s3:// root whose bytes go
through the library's own writer and reader, its errors said naming the
object, its requests counted (requests.py), and a bucket's control plane
(listings, batched deletes, a run's markers) through the boto3 client
ObjectBackend's already uses, counted too (s3dlio's few control calls are
made through it here, so every request of the run is in the tally)."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import threading
import time
from abc import abstractmethod
from typing import Iterator, Optional

from dlio_ckpt_ext.engine.storage_interface import Reader
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.storage import bucket
from dlio_ckpt_ext.storage.cloud import storage_error
from dlio_ckpt_ext.storage.libraries import LIBRARIES
from dlio_ckpt_ext.storage.libraries.requests import PROCESS, count_boto3
from dlio_ckpt_ext.storage.objstore import ObjectBackend, ObjectOptions
from dlio_ckpt_ext.result_files import OWNER_FILE
from dlio_ckpt_ext.storage.ranged_reader import PlannedRangeReader


class LibraryBackend(ObjectBackend):
    """An s3:// root reached through client library `library` (a subclass each)."""
    library = ""
    lends_write_memory = False
    lends_read_memory = True  # each library hands back its own bytes; no read pool

    def __init__(self, root: str, opts: ObjectOptions, cpu_share: Optional[float] = None) -> None:
        super().__init__(root, opts, cpu_share)
        if self.scheme != "s3":
            raise ConfigError("workload.storage.storage_options.storage_library", self.library,
                              f"s3dlio for {self.scheme}:// roots ({self.library} is an S3 client)")
        # ObjectBackend set these for s3dlio: each library says its own
        self.lends_write_memory = type(self).lends_write_memory
        self.read_cache_method, self.write_cache_method = type(self).read_cache_method, type(self).write_cache_method
        self.reads_may_be_cached = self.writes_may_be_cached = False
        self.has_directories = False
        self.bucket, prefix = bucket.split(self.root)
        self.prefix = prefix + "/" if prefix else ""
        self.endpoint = os.environ.get("AWS_ENDPOINT_URL") or ""
        self.region = os.environ.get("AWS_REGION") or "us-east-1"
        self.counts = PROCESS
        count_boto3(bucket.client())
        self._client = None
        self._client_lock = threading.Lock()

    def client(self):
        """The library's client, one a backend, made at its first use (not before a fork)."""
        with self._client_lock:
            if self._client is None:
                self._client = self.make_client()
            return self._client
    def key(self, path: str) -> str:
        return self.prefix + path

    # -- what each library gives ------------------------------------------
    @abstractmethod
    def make_client(self):
        """The library's client for this root's endpoint, region and the environment's keys."""

    @abstractmethod
    def missing(self, exc: BaseException) -> bool:
        """Whether the library's error says the object is not there."""

    @abstractmethod
    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of object `key`, counted."""

    @abstractmethod
    def head(self, key: str) -> int:
        """The size of object `key` (one HEAD, counted); the library's error when missing."""

    def settings(self) -> dict:
        """The library's settings in force, for the record and RESULTS."""
        return {}

    # -- shared -----------------------------------------------------------
    @contextlib.contextmanager
    def errors(self, uri: str, action: str) -> Iterator[None]:
        """The library's errors as StorageErrors naming the object (as the clouds' backends say theirs)."""
        start = time.monotonic()
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - each library has its own error types
            raise storage_error(uri, action, exc, self._classify, self.endpoint or "(default)",
                                time.monotonic() - start) from exc

    def _classify(self, exc: BaseException) -> tuple[str, str]:
        return ("missing" if self.missing(exc) else "", f"{type(exc).__name__} through {self.library}: {exc}")

    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        uri, key = self.uri(path), self.key(path)

        def get_range(offset: int, length: int) -> bytes:
            with self.errors(uri, "cannot read"):
                return self.get_range(key, offset, length)

        def stat() -> int:
            with self.errors(uri, "cannot stat"):
                return self.head(key)
        return PlannedRangeReader(uri, size, get_range, stat, probe=False)

    def probe(self) -> None:
        """One listing of at most one key: fails fast on a wrong endpoint, credentials or bucket."""
        try:
            bucket.client().list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except Exception as exc:  # noqa: BLE001 - botocore's errors say what went wrong
            raise StorageError(f"cannot reach {self.root} (endpoint {self.endpoint or '(default)'}): {exc}") from None

    def delete_file(self, path: str) -> bool:
        """One DELETE (S3 answers alike whether or not the object was there)."""
        try:
            bucket.client().delete_object(Bucket=self.bucket, Key=self.key(path))
        except Exception as exc:  # noqa: BLE001 - botocore's errors say what went wrong
            raise StorageError(f"cannot delete {self.uri(path)}: {exc}") from None
        return True

    def exists(self, path: str) -> bool:
        """One HEAD through the library, as its framework probes a commit marker."""
        try:
            with self.errors(self.uri(path), "cannot stat"):
                self.head(self.key(path))
        except StorageError as exc:
            if str(exc).startswith("missing checkpoint file"):
                return False
            raise
        return True

    # -- a resume's discovery through the library, as its framework looks --------------
    def read_marker(self, path: str) -> Optional[bytes]:
        """A small file a framework reads to find its checkpoint (a tracker, a marker), whole,
        through the library; None when missing."""
        with self.errors(self.uri(path), "cannot read"):
            return self.get_whole(self.key(path))

    def children(self, directory: str) -> list[str]:
        """The names one level below `directory` (objects and folders), through the library's listing."""
        start = self.key(directory.strip("/")).rstrip("/")
        start = start + "/" if start else ""
        with self.errors(self.uri(directory), "cannot list"):
            found = {n[len(start):].rstrip("/") for n in self.list_names(start)}
        return sorted(n for n in found if n and n != OWNER_FILE)

    def get_whole(self, key: str) -> Optional[bytes]:
        """All of object `key`, None when missing. Default: the control plane's GET (boto3)."""
        return bucket.get(f"s3://{self.bucket}/{key}")

    def list_names(self, prefix: str) -> Iterator[str]:
        """Keys and sub-prefixes one level below `prefix`, whole. Default: the control plane's listing."""
        return (prefix + n for n in bucket.names(f"s3://{self.bucket}/{prefix}"))

    def request_counts(self) -> Optional[dict]:
        return self.counts.snapshot()

    def start_retry_counting(self) -> None:
        """s3dlio's log counts s3dlio's retries only: this library's are not counted (said in describe)."""

    def retry_counts(self) -> Optional[dict]:
        return None

    def chunk_warning(self, chunk_size: int) -> Optional[str]:
        return None

    def describe(self) -> dict:
        package = LIBRARIES[self.library][1]
        return {"storage_type": "s3", "root": self.root, "scheme": "s3", "endpoint_url": self.endpoint or None,
                "region": self.region, "storage_library": self.library,
                "library_version": importlib.metadata.version(package), **self.settings(),
                "retries_counted": False,
                "read_cache_method": self.read_cache_method, "reads_may_be_cached": False,
                "write_cache_method": self.write_cache_method, "writes_may_be_cached": False}

