"""What Azure Blob (az://) and Google Cloud Storage (gs://) share: their
options, the backend's control plane over a client's few calls, ranged reads
that know the plan's size, and errors that name the object.

Each cloud is reached through its own SDK (azure-storage-blob,
google-cloud-storage), which reads its credentials from the environment as
it documents them; nothing here prints or records them.
"""
from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from dlio_ckpt_ext.engine.storage_interface import Backend, Reader, Writer
from dlio_ckpt_ext.storage.ranged_reader import PlannedRangeReader
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.result_files import OWNER_FILE
from dlio_ckpt_ext.storage.allocator import reuse_freed_memory
from dlio_ckpt_ext.storage.lent_blocks import SpareBuffers
from dlio_ckpt_ext.storage.retries import COUNTS

SCHEMES = ("az", "gs")


@dataclass(frozen=True)
class CloudOptions:
    max_in_flight: int = 8        # blocks of one object uploading at once (GCS: its chunks go one at a time)
    operation_timeout_s: int = 60  # one request's read timeout, seconds
    connect_timeout_s: int = 20    # opening a connection
    max_attempts: int = 3          # attempts per request, the first included
    retry_backoff_s: float = 0.0   # the first retry's wait, doubling after; 0 = the SDK's (Azure 15 s, GCS 1 s)
    # MLCommons' fork asks storage_type s3 for a storage_library and defaults it to
    # s3dlio's: accepted as that, though az:// and gs:// bytes go through the clouds' SDKs;
    # on gs://, tensorstore (or framework with Orbax's layout) goes through TensorStore's gcs
    # kvstore (storage/libraries.resolve_cloud says what each scheme takes)
    storage_library: Optional[str] = None

    def validate(self, key: str) -> None:
        for name in ("max_in_flight", "operation_timeout_s", "connect_timeout_s", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 1:
                raise ConfigError(key + name, value, "a positive integer")
        if isinstance(self.retry_backoff_s, bool) or self.retry_backoff_s < 0:
            raise ConfigError(key + "retry_backoff_s", self.retry_backoff_s, "0 (the SDK's default) or more seconds")


#: GCS takes a resumable upload's chunks one at a time, in order
GCS_IN_FLIGHT = 1


def blocks_in_flight(scheme: str, opts: CloudOptions) -> int:
    """Blocks of one object uploading at once (each writer holds one more, being filled)."""
    return GCS_IN_FLIGHT if scheme == "gs" else opts.max_in_flight


#: an SDK error -> (kind, detail): kind is "missing", "refused", "gone" or "" (anything else)
Classify = Callable[[BaseException], tuple[str, str]]


def storage_error(uri: str, action: str, exc: BaseException, classify: Classify, endpoint: str,
                  waited: float) -> StorageError:
    kind, detail = classify(exc)
    if kind == "missing":
        return StorageError(f"missing checkpoint file {uri}")
    if kind == "refused":
        return StorageError(f"{action} {uri}: the storage refused the credentials ({detail})")
    if kind == "gone":
        return StorageError(f"{action} {uri}: the endpoint {endpoint} stopped answering after {waited:.1f} s "
                            f"({detail})")
    return StorageError(f"{action} {uri}: {detail}")


class CloudBackend(Backend):
    """A container or bucket prefix. Subclasses give the client's calls
    (`_*` below, keys relative to the container/bucket) and `open_writer`."""
    has_directories = False
    lends_write_memory = True
    lends_read_memory = True
    read_cache_method = "none needed: every read is a request to the object server"
    write_cache_method = "none needed: a save ends when its uploads completed"
    scheme = ""
    endpoint = ""
    #: the most keys one delete request takes (1: one request a key)
    delete_batch = 1

    def __init__(self, root: str, opts: CloudOptions) -> None:
        self.root, self.opts = root.rstrip("/"), opts
        self.container, _, self.prefix = self.root[len(self.scheme) + 3:].partition("/")
        if not self.container:
            raise ConfigError("workload.storage.storage_root", root,
                              f"{self.scheme}://{'CONTAINER' if self.scheme == 'az' else 'BUCKET'}/PREFIX")
        self.spare = SpareBuffers()
        # the SDKs allocate every GET's bytes: freed, they are reused instead of faulted in anew
        self.freed_memory_reused = reuse_freed_memory()
        self._deleters = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{self.scheme}-delete")

    # -- the client's calls
    @abstractmethod
    def _sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object below prefix."""

    @abstractmethod
    def _names(self, prefix: str) -> Iterator[str]:
        """The keys and sub-prefixes one level below prefix (delimiter '/')."""

    @abstractmethod
    def _delete(self, keys: list[str]) -> int:
        """Delete up to delete_batch keys in one request; the count deleted."""

    @abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _get(self, key: str, offset: int = 0, length: Optional[int] = None) -> Optional[bytes]:
        """The bytes (a range of them), or None when there is no such object."""

    @abstractmethod
    def _size(self, key: str) -> int: ...

    @abstractmethod
    def _check_container(self) -> None: ...

    @abstractmethod
    def classify(self, exc: BaseException) -> tuple[str, str]: ...

    # -- Backend
    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix and path else (self.prefix or path)

    def uri(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    @contextlib.contextmanager
    def errors(self, path: str, action: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDKs' errors have no common base
            raise storage_error(self.uri(path), action, exc, self.classify, self.endpoint,
                                time.monotonic() - start) from None

    def prepare(self, directory: str) -> None:
        pass

    def probe(self) -> None:
        kind = "container" if self.scheme == "az" else "bucket"
        try:
            self._check_container()
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001
            what, detail = self.classify(exc)
            if what == "missing":
                raise StorageError(f"cannot reach {self.root}: the {kind} {self.container} does not exist at "
                                   f"{self.endpoint}") from None
            raise storage_error(self.root, "cannot reach", exc, self.classify, self.endpoint, 0.0) from None

    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        key = self.key(path)

        def get_range(offset: int, length: int) -> bytes:
            with self.errors(path, "cannot read"):
                data = self._get(key, offset, length)
            if data is None:
                raise StorageError(f"missing checkpoint file {self.uri(path)}")
            return data

        def stat() -> int:
            with self.errors(path, "cannot stat"):
                return self._size(key)
        return PlannedRangeReader(self.uri(path), size, get_range, stat)

    def _dir_prefix(self, directory: str) -> str:
        key = self.key(directory.strip("/"))
        return key + "/" if key else ""

    def list_sizes(self, directory: str) -> dict[str, int]:
        base = self._dir_prefix("")
        with self.errors(directory, "cannot list"):
            return {k[len(base):]: n for k, n in self._sizes(self._dir_prefix(directory))}

    def children(self, directory: str) -> list[str]:
        start = self._dir_prefix(directory)
        with self.errors(directory, "cannot list"):
            found = {n[len(start):].rstrip("/") for n in self._names(start)}
        return sorted(n for n in found if n and n != OWNER_FILE)

    def delete_files(self, paths: list[str]) -> int:
        keys = [self.key(p) for p in paths]
        batches = [keys[i:i + self.delete_batch] for i in range(0, len(keys), self.delete_batch)]
        with self.errors(paths[0] if paths else "", "cannot delete"):
            return sum(self._deleters.map(self._delete, batches))

    def delete_file(self, path: str) -> bool:
        return self.delete_files([path]) == 1

    def write_marker(self, path: str, data: bytes) -> None:
        with self.errors(path, "cannot write"):
            self._put(self.key(path), data)

    def read_marker(self, path: str) -> Optional[bytes]:
        with self.errors(path, "cannot read"):
            return self._get(self.key(path))

    def exists(self, path: str) -> bool:
        """One request for the object's properties."""
        try:
            self._size(self.key(path))
        except Exception as exc:  # noqa: BLE001 - the SDKs' errors have no common base
            # GCS's SDK answers a missing blob with None, which _size says as ours
            if self.classify(exc)[0] == "missing" or str(exc).startswith("missing checkpoint file"):
                return False
            raise storage_error(self.uri(path), "cannot stat", exc, self.classify, self.endpoint, 0.0) from None
        return True

    def write_concurrency(self, chunk_size: int) -> dict:
        return {"requests_in_flight": blocks_in_flight(self.scheme, self.opts), "request_bytes": chunk_size,
                "note": "per object, one block per chunk"}

    def retry_counts(self) -> Optional[dict]:
        return COUNTS.snapshot()

    def describe(self) -> dict:
        return {"storage_type": "s3", "root": self.root, "scheme": self.scheme, "endpoint_url": self.endpoint,
                "blocks_in_flight": blocks_in_flight(self.scheme, self.opts), "operation_timeout_s": self.opts.operation_timeout_s,
                "connect_timeout_s": self.opts.connect_timeout_s, "max_attempts": self.opts.max_attempts,
                "retry_backoff_s": self.opts.retry_backoff_s,
                "freed_memory_reused": self.freed_memory_reused, **super().describe()}

    @abstractmethod
    def open_writer(self, path: str, size: int) -> Writer: ...
