"""The small interface every storage backend implements, owned by the engine
that drives it (the backends in storage/ implement it; the engine knows none).

Paths are relative to the backend's root and use '/' separators.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional


class Writer(ABC):
    """Sequential writer of one file or object."""

    #: True when the writer lends its own memory (reserve/commit) for the
    #: generator to fill in place: no pool buffer and no copy on the way out
    zero_copy: bool = False

    def reserve(self, n: int) -> memoryview:
        raise NotImplementedError

    def commit(self, n: int) -> None:
        raise NotImplementedError

    @abstractmethod
    def write(self, data: memoryview) -> None:
        """Append all of data. Only the last call of a file may be unaligned."""

    @abstractmethod
    def close(self) -> None:
        """Make the file durable (fsync, upload completion) and release it."""

    @abstractmethod
    def abort(self) -> None:
        """Discard what was written: no partial file or upload remains."""


class Reader(ABC):
    """Random-access reader of one file or object; safe to call from threads."""

    size: int
    #: True when read() hands out the client library's own memory (no copy,
    #: no pool buffer needed)
    lends_memory: bool = False

    def read(self, offset: int, length: int) -> memoryview:
        """Up to length bytes at offset, in memory the reader lends (lends_memory)."""
        raise NotImplementedError

    @abstractmethod
    def readinto(self, offset: int, buf: memoryview, length: int) -> int:
        """Read up to length bytes at offset into buf[:length]; return the count.

        buf may be larger than length (callers pass whole pool buffers, whose
        size is a multiple of the page size) so direct I/O can round up.
        """

    def read_view(self, offset: int, buf: memoryview, length: int) -> memoryview:
        """Read up to length bytes at offset using buf's memory; the bytes read,
        wherever in buf they landed (a reader may leave them where it read them
        rather than move them to buf's start)."""
        return buf[:self.readinto(offset, buf, length)]

    def close(self) -> None:
        pass


class Backend(ABC):
    """A storage root: a directory, a bucket prefix, ..."""

    #: True when a file needs its directory made first (object stores have none)
    has_directories: bool = True
    #: True when its client renames an object (a copy and a delete), as the framework it stands for
    #: commits a file written under a temporary name; object stores otherwise write in place
    renames_objects: bool = False
    #: True when every writer it opens is zero_copy: no write pool is needed
    lends_write_memory: bool = False
    #: True when its readers lend their memory: the read pool only counts requests
    lends_read_memory: bool = False
    #: how the read phase avoids client caches, recorded in the results
    read_cache_method: str = "none"
    #: True when reads right after writes may be served from a client cache
    reads_may_be_cached: bool = False
    #: how a write counts only once it reached the storage, recorded with the results
    write_cache_method: str = "none needed"
    #: True when a save may end before its bytes left a client cache
    writes_may_be_cached: bool = False

    @abstractmethod
    def uri(self, path: str) -> str:
        """Full name of path, for messages and results."""

    @abstractmethod
    def prepare(self, directory: str) -> None:
        """Make directory usable for writing; safe to call from many ranks."""

    def probe(self) -> None:
        """Fail fast (one cheap request, from one rank) if the storage is unusable."""

    @abstractmethod
    def open_writer(self, path: str, size: int) -> Writer:
        ...

    @abstractmethod
    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        """size: what the caller knows it to be (saves a request where asking costs one)."""

    @abstractmethod
    def list_sizes(self, directory: str) -> dict[str, int]:
        """Sizes of every file below directory, keyed by path relative to the root."""

    def children(self, directory: str) -> list[str]:
        """Names of the entries directly below directory (files and directories)."""
        prefix = directory.strip("/") + "/" if directory.strip("/") else ""
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self.list_sizes(directory)})

    @abstractmethod
    def delete_file(self, path: str) -> bool:
        """Delete one file or object; False if it was not there."""

    def delete_files(self, paths: list[str]) -> int:
        """Delete the files (as many per request as the storage takes); the count deleted."""
        return sum(self.delete_file(p) for p in paths)

    def remove_empty_dir(self, directory: str) -> None:
        """Remove directory if it is empty (object stores have none)."""

    def rename(self, src: str, dst: str) -> None:
        """Rename directory src to dst, on storage with directories (a commit by rename), or
        object src to dst where renames_objects."""
        raise NotImplementedError(f"{type(self).__name__} cannot rename {src}")

    def write_concurrency(self, chunk_size: int) -> dict:
        """Writes in flight per rank: the engine writes each file's chunks in order."""
        return {"requests_in_flight": 1, "request_bytes": chunk_size}

    def read_concurrency(self, requests_in_flight: int, request_bytes: int) -> dict:
        """Reads in flight per rank: the engine's read_parallelism requests of read_size."""
        return {"requests_in_flight": requests_in_flight, "request_bytes": request_bytes,
                "note": "per file or range read, at most one request per read_size piece of it"}

    def write_marker(self, path: str, data: bytes) -> None:
        """A small file (a run's ownership marker), written whole, replacing any."""
        raise NotImplementedError

    def read_marker(self, path: str) -> Optional[bytes]:
        """A small file's bytes, or None when there is none."""
        raise NotImplementedError

    def create_marker(self, path: str, data: bytes) -> Optional[bool]:
        """A small file created only where there is none, in one atomic step: True when
        created, False when one was there; None where the storage has no such step
        (object stores: not every server honours a conditional create)."""
        return None

    def exists(self, path: str) -> bool:
        """Whether file `path` is there: one stat or HEAD, as a framework probes a commit marker."""
        raise NotImplementedError

    def open_uploads(self) -> list[dict]:
        """Uploads left unfinished below the root, [{key, upload_id, initiated}] (key
        relative to the bucket or container), where the storage can list them."""
        return []

    def abort_uploads(self, uploads: list[dict]) -> int:
        """Discard those uploads; the count discarded."""
        return 0

    def start_retry_counting(self) -> None:
        """Count this process's retries from now on, where the client needs telling (s3dlio)."""

    def retry_counts(self) -> Optional[dict]:
        """This process's throttled, retried and given-up requests so far
        ({throttled, retried, gave_up}, storage/retries.py), or None where the
        client cannot tell (a file system has no throttles to count)."""
        return None

    def request_counts(self) -> Optional[dict]:
        """This process's requests by kind so far (storage/libraries/requests.py), or
        None where they are not counted here (s3dlio's are counted by the server only)."""
        return None

    def chunk_warning(self, chunk_size: int) -> Optional[str]:
        """What a reader must know of chunks this size on this storage, if anything."""
        return None

    def describe(self) -> dict:
        """Settings worth recording with a result (never credentials)."""
        return {"read_cache_method": self.read_cache_method,
                "reads_may_be_cached": self.reads_may_be_cached,
                "write_cache_method": self.write_cache_method,
                "writes_may_be_cached": self.writes_may_be_cached}
