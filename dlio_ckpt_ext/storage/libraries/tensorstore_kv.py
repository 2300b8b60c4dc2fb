"""Orbax's client: TensorStore's s3 kvstore, and on gs:// its gcs kvstore
(Orbax's native object path; GCS takes the condition as ifGenerationMatch,
no HEAD). Orbax writes its OCDBT data files through it. A data file is assembled whole in memory, then sent as
one PUT; a read is one ranged GET. The writer lends that memory to the
generator (no pool, no copy in), and starts the PUT as its last byte is
filled, so the next file is generated while it uploads, as TensorStore's
request pool overlaps them; TensorStore takes bytes only, so the value is
copied once as it starts.

An OCDBT database's manifest (`manifest.ocdbt`) is written as OCDBT commits
it, through TensorStore's conditional write: the database's first commit reads
the manifest (a GET, missing), then writes it only if still absent; each next
commit only if it is still the one this rank wrote last. TensorStore sends the
condition as If-None-Match: * / If-Match: <etag>, after a HEAD on an endpoint
other than AWS's (fidelity/manifests/requests/orbax-*.json: the real Orbax's
save through this driver). A condition that fails (another writer in the
same database) is an error naming the manifest."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import posixpath
import threading
import time
from typing import Iterator, Optional

from dlio_ckpt_ext.engine.storage_interface import Writer
from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage import bucket
from dlio_ckpt_ext.storage.cloud import CloudOptions, storage_error
from dlio_ckpt_ext.storage.gcs import GcsBackend
from dlio_ckpt_ext.storage.libraries.library_backend import LibraryBackend
from dlio_ckpt_ext.storage.libraries.requests import PROCESS

#: TensorStore's s3_request_concurrency and gcs_request_concurrency default
REQUEST_CONCURRENCY = 32
#: the file OCDBT commits conditionally
OCDBT_MANIFEST = "manifest.ocdbt"


class TensorstoreWriter(Writer):
    zero_copy = True

    def __init__(self, backend: "TensorstoreKv", path: str, size: int) -> None:
        self.backend, self.uri, self.key, self.size = backend, backend.uri(path), backend.key(path), size
        self.buf: Optional[bytearray] = bytearray(size)
        self.filled, self.future = 0, None
        if size == 0:
            self._send()

    def reserve(self, n: int) -> memoryview:
        return memoryview(self.buf)[self.filled:self.filled + n]

    def commit(self, n: int) -> None:
        self.filled += n
        if self.filled == self.size:
            self._send()

    def write(self, data: memoryview) -> None:
        self.reserve(len(data))[:] = data
        self.commit(len(data))

    def _send(self) -> None:
        value, self.buf = bytes(self.buf), None
        with self.backend.kv_errors(self.uri, "cannot upload"):
            if posixpath.basename(self.key) == OCDBT_MANIFEST:
                self.future = self.backend.commit(self.key, value)
            else:
                self.future = self.backend.kv().write(self.key, value)

    def close(self) -> None:
        if self.future is None:
            raise StorageError(f"{self.uri}: {self.filled} bytes written, expected {self.size}")
        with self.backend.kv_errors(self.uri, "cannot upload"):
            stamp = self.future.result()
        if posixpath.basename(self.key) == OCDBT_MANIFEST:
            self.backend.committed(self.key, self.uri, stamp.generation)
        self.backend.counts.add("PUT")

    def abort(self) -> None:
        self.buf = None
        if self.future is not None:
            self.future.cancel()


class TensorstoreKv:
    """What TensorStore's kvstore gives a backend on either store: its writer,
    OCDBT's conditional commits and its ranged reads (kv(): the kvstore)."""
    library = "tensorstore"
    lends_write_memory = True
    write_cache_method = "none needed: a save ends when each file's PUT completed"
    read_cache_method = "none needed: every read is a request to the object server (no cache_pool)"
    #: whether TensorStore checks a write's condition with a HEAD first (S3 off AWS; GCS takes it whole)
    heads_before_conditions = False

    def _kv_init(self) -> None:
        self._generations: dict[str, bytes] = {}   # each OCDBT manifest's, as this rank last wrote it
        self._generations_lock = threading.Lock()
        self.counts = PROCESS

    def kv(self):
        """The TensorStore kvstore of this root's bucket."""
        raise NotImplementedError

    def kv_errors(self, uri: str, action: str):
        """TensorStore's errors as StorageErrors naming the object."""
        raise NotImplementedError

    def commit(self, key: str, value: bytes):
        """Writes an OCDBT manifest only if it is as this rank last left it (absent at first)."""
        with self._generations_lock:
            generation = self._generations.get(key)
        if generation is None:  # the database's first commit reads its manifest first
            self.counts.add("GET")
            generation = self.kv().read(key).result().stamp.generation
        if self.heads_before_conditions:
            self.counts.add("HEAD")  # TensorStore checks the condition itself where S3's may be missing
        return self.kv().write(key, value, if_equal=generation)

    def committed(self, key: str, uri: str, generation: bytes) -> None:
        if not generation:  # TensorStore's answer when the condition failed
            raise StorageError(f"{uri}: the OCDBT manifest changed under this save (another writer in the "
                               "same database): its conditional write was refused")
        with self._generations_lock:
            self._generations[key] = generation

    def kv_read(self, key: str, offset: int = 0, length: Optional[int] = None) -> Optional[bytes]:
        """Bytes [offset, offset + length) of `key` (all of it without a length), one GET; None when missing."""
        self.counts.add("GET")
        try:
            got = self.kv().read(key, byte_range=slice(offset, None if length is None else offset + length)).result()
        except ValueError as exc:
            # past the object's end: S3 answers what there is, TensorStore's gcs driver refuses the
            # range; what there is (a reader asks one byte past a file's end to see it is no longer)
            if "OUT_OF_RANGE" not in str(exc):
                raise
            if length is None:   # the offset itself is past the end
                return b""
            return self.kv_read(key, offset)
        return None if got.state == "missing" else got.value

    def open_writer(self, path: str, size: int) -> Writer:
        return TensorstoreWriter(self, path, size)

    def write_concurrency(self, chunk_size: int) -> dict:
        return {"requests_in_flight": 1, "request_bytes": None,
                "note": "each file held whole, one PUT a file as its last byte is filled"}

    def settings(self) -> dict:
        driver = "gcs" if self.scheme == "gs" else self.scheme
        return {f"{driver}_request_concurrency": REQUEST_CONCURRENCY, "holds_whole_files": True,
                "single_put_per_file": True}


class TensorstoreBackend(TensorstoreKv, LibraryBackend):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._kv_init()
        self.heads_before_conditions = bool(self.endpoint) and "amazonaws.com" not in self.endpoint

    def kv(self):
        return self.client()

    def kv_errors(self, uri: str, action: str):
        return self.errors(uri, action)

    def make_client(self):
        import tensorstore as ts
        spec = {"driver": "s3", "bucket": self.bucket, "aws_region": self.region,
                **({"endpoint": self.endpoint} if self.endpoint else {}),
                # the environment's keys, where given: its default chain first reads (and complains on
                # stderr of) profile files this machine may not have
                **({"aws_credentials": {"type": "environment"}} if os.environ.get("AWS_ACCESS_KEY_ID") else {})}
        return ts.KvStore.open(spec).result()

    def missing(self, exc: BaseException) -> bool:
        return isinstance(exc, KeyError) or "NOT_FOUND" in str(exc) or "404" in str(exc)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        got = self.kv_read(key, offset, length)
        if got is None:
            raise KeyError(key)
        return got

    def get_whole(self, key: str) -> Optional[bytes]:
        return self.kv_read(key)

    def head(self, key: str) -> int:
        # TensorStore reads no size alone: a HEAD through the bucket's control plane (only a
        # caller without the plan's size asks; a framework learns sizes from its manifest), counted as
        # boto3 sends it
        return bucket.client().head_object(Bucket=self.bucket, Key=key)["ContentLength"]


class TensorstoreGcsBackend(TensorstoreKv, GcsBackend):
    """A gs:// root with its data through TensorStore's gcs kvstore, as Orbax writes to GCS; its
    bookkeeping (listings, deletes, sizes, a run's markers) through the GCS SDK as GcsBackend's.
    TensorStore reaches an emulator through TENSORSTORE_GCS_HTTP_URL, set here from the SDK's
    STORAGE_EMULATOR_HOST where only that is given."""

    def __init__(self, root: str, opts: CloudOptions) -> None:
        super().__init__(root, opts)
        self._kv_init()
        self._kv, self._kv_lock = None, threading.Lock()

    def kv(self):
        with self._kv_lock:
            if self._kv is None:
                import tensorstore as ts
                if os.environ.get("STORAGE_EMULATOR_HOST"):
                    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", os.environ["STORAGE_EMULATOR_HOST"])
                self._kv = ts.KvStore.open({"driver": "gcs", "bucket": self.container}).result()
            return self._kv

    @contextlib.contextmanager
    def kv_errors(self, uri: str, action: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - TensorStore's errors are ValueErrors with a status
            raise storage_error(uri, action, exc, self.classify, self.endpoint, time.monotonic() - start) from None

    def classify(self, exc: BaseException) -> tuple[str, str]:
        if isinstance(exc, ValueError) and "NOT_FOUND" in str(exc):
            return "missing", str(exc).splitlines()[0]
        return super().classify(exc)

    def _get(self, key: str, offset: int = 0, length: Optional[int] = None) -> Optional[bytes]:
        return self.kv_read(key, offset, length)

    def describe(self) -> dict:
        return {**super().describe(), "storage_library": self.library,
                "library_version": importlib.metadata.version("tensorstore"), **self.settings(),
                "retries_counted": False}


BACKEND = TensorstoreBackend
