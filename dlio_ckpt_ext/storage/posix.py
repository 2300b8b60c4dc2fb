"""local_fs backend: buffered + fsync or O_DIRECT writes, O_DIRECT or
buffered (+ fadvise) reads."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from typing import Optional

from dlio_ckpt_ext.engine.buffers import PAGE
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.result_files import OWNER_FILE
from dlio_ckpt_ext.engine.storage_interface import Backend, Reader, Writer

IO_MODES = ("direct", "buffered")


@dataclass(frozen=True)
class PosixOptions:
    write_mode: str = "direct"   # direct (O_DIRECT) | buffered (page cache + fsync)
    read_mode: str = "direct"    # direct (O_DIRECT) | buffered
    fadvise: bool = True         # DONTNEED after each written file and before buffered reads
    # MLCommons' DLIO fork demands these with its storage_type direct_fs
    # (s3dlio's direct:// scheme); only those values are accepted, and only there
    storage_library: Optional[str] = None   # direct_fs: s3dlio
    uri_scheme: Optional[str] = None        # direct_fs: direct

    def validate(self, prefix: str) -> None:
        for key in ("write_mode", "read_mode"):
            if getattr(self, key) not in IO_MODES:
                raise ConfigError(f"{prefix}{key}", getattr(self, key), " or ".join(IO_MODES))

    def check_storage_type(self, storage_type: str, prefix: str) -> None:
        """direct_fs means O_DIRECT reads and writes, and nothing else; the fork's
        keys that select its s3dlio path mean nothing for a plain local_fs."""
        fork_keys = {"storage_library": "s3dlio", "uri_scheme": "direct"}
        for key, wanted in fork_keys.items():
            value = getattr(self, key)
            if value is None:
                continue
            if storage_type != "direct_fs":
                raise ConfigError(f"{prefix}{key}", value, f"unset with storage_type {storage_type} (it is "
                                  "MLCommons' DLIO fork's switch for storage_type direct_fs, or s3)")
            if value != wanted:
                raise ConfigError(f"{prefix}{key}", value, f"{wanted} (or unset) with storage_type direct_fs")
        if storage_type == "direct_fs":
            for key in ("write_mode", "read_mode"):
                if getattr(self, key) != "direct":
                    raise ConfigError(f"{prefix}{key}", getattr(self, key),
                                      "direct with storage_type direct_fs (O_DIRECT both ways); for buffered "
                                      "I/O use storage_type local_fs")


def _os_error(path: str, action: str, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOENT and action == "cannot open":
        return StorageError(f"missing checkpoint file {path}", errno=exc.errno)
    return StorageError(f"{action} {path}: {exc.strerror or exc}", errno=exc.errno)


def _direct_unsupported(path: str, key: str) -> StorageError:
    return StorageError(f"O_DIRECT is not supported for {path}; set "
                        f"++workload.storage.storage_options.{key}=buffered to measure this file system",
                        errno=errno.EINVAL)


class PosixWriter(Writer):
    def __init__(self, path: str, opts: PosixOptions, fsync: bool) -> None:
        self.path, self.opts, self.fsync = path, opts, fsync
        self.direct = opts.write_mode == "direct"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if self.direct else 0)
        try:
            self.fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.EINVAL and self.direct:
                raise _direct_unsupported(path, "write_mode") from exc
            raise _os_error(path, "cannot create", exc) from exc

    def _write_all(self, data: memoryview) -> None:
        while len(data):
            data = data[os.write(self.fd, data):]

    def write(self, data: memoryview) -> None:
        try:
            if self.direct and len(data) % PAGE:
                # The unaligned tail of a file: write the aligned part directly,
                # then the rest through the page cache (fsync makes it durable).
                aligned = len(data) - len(data) % PAGE
                self._write_all(data[:aligned])
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False
                data = data[aligned:]
            self._write_all(data)
        except OSError as exc:
            if exc.errno == errno.EINVAL and self.direct:
                raise _direct_unsupported(self.path, "write_mode") from exc
            raise _os_error(self.path, "cannot write", exc) from exc

    def close(self) -> None:
        try:
            if self.fsync:
                os.fsync(self.fd)
            if self.opts.fadvise:
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            self.abort()
            raise _os_error(self.path, "cannot sync", exc) from exc
        os.close(self.fd)

    def abort(self) -> None:
        # may run twice (a failed close aborts, then the engine's file window):
        # closing the number again could close a file another thread opened since
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class PosixReader(Reader):
    def __init__(self, path: str, opts: PosixOptions) -> None:
        self.path = path
        self.direct = opts.read_mode == "direct"
        try:
            self.fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
        except OSError as exc:
            if exc.errno == errno.EINVAL and self.direct:
                raise _direct_unsupported(path, "read_mode") from exc
            raise _os_error(path, "cannot open", exc) from exc
        self.size = os.fstat(self.fd).st_size
        if not self.direct and opts.fadvise:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def readinto(self, offset: int, buf: memoryview, length: int) -> int:
        view = self.read_view(offset, buf, length)
        if offset % PAGE and self.direct:  # moved to buf's start, as readinto promises
            buf[:len(view)] = view
        return len(view)

    def read_view(self, offset: int, buf: memoryview, length: int) -> memoryview:
        # O_DIRECT needs whole pages: a range starting inside a page (a saved item
        # a restore reads) is read from the page's start, and its bytes are used
        # where they landed (moving them down cost a copy of the whole request:
        # 10% of a chunked restore's time, bench/layout_bench.py); the engine ends
        # that first request at a read_size boundary, so it fits buf
        head = offset % PAGE if self.direct else 0
        got = self._read_pages(offset - head, buf, head + length)
        return buf[head:max(head, got)]

    def _read_pages(self, offset: int, buf: memoryview, length: int) -> int:
        # O_DIRECT: ask for length rounded up to whole pages; EOF cuts it short
        want = -(-length // PAGE) * PAGE if self.direct else length
        done = 0
        try:
            while done < length:
                n = os.preadv(self.fd, [buf[done:want]], offset + done)
                if n == 0:
                    break
                done += n
        except OSError as exc:
            raise _os_error(self.path, "cannot read", exc) from exc
        return min(done, length)

    def close(self) -> None:
        os.close(self.fd)


def tree_sizes(root: str, directory: str) -> dict[str, int]:
    """Sizes of every file below root/directory, keyed by path relative to root."""
    sizes = {}
    for dirpath, _, names in os.walk(os.path.join(root, directory)):
        for name in names:
            full = os.path.join(dirpath, name)
            sizes[os.path.relpath(full, root)] = os.path.getsize(full)
    return sizes


def entries(path: str) -> list[str]:
    """The names in directory `path` (none if it is not there or is a file), a run's owner marker left out."""
    try:
        return sorted(n for n in os.listdir(path) if n != OWNER_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _beside(path: str) -> str:
    return f"{path}.{os.getpid()}.tmp"


def _written_beside(path: str, data: bytes) -> str:
    """A marker's bytes in a file beside its name, for the caller to put in place."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(_beside(path), "wb") as fh:
        fh.write(data)
    return _beside(path)


def write_marker_file(path: str, data: bytes) -> None:
    """Written beside, then renamed over: a reader sees the old marker or the new one."""
    try:
        os.replace(_written_beside(path, data), path)
    except OSError as exc:
        raise _os_error(path, "cannot write", exc) from exc


def create_marker_file(path: str, data: bytes) -> Optional[bool]:
    """Written beside, then linked to its name, which fails where the name exists: True
    when created, False when a file was there, None where the file system has no hard
    links (then only a write and a read back can tell)."""
    try:
        os.link(_written_beside(path, data), path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            return None
        raise _os_error(path, "cannot write", exc) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(_beside(path))


def read_marker_file(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error(path, "cannot read", exc) from exc


class PosixBackend(Backend):
    def __init__(self, root: str, opts: PosixOptions, fsync: bool = True, storage_type: str = "local_fs") -> None:
        self.root, self.opts, self.fsync = os.path.abspath(root), opts, fsync
        self.storage_type = storage_type
        self.read_cache_method = {
            "direct": "O_DIRECT reads",
            "buffered": "posix_fadvise(DONTNEED) after write and before read" if opts.fadvise else "none",
        }[opts.read_mode]
        self.reads_may_be_cached = opts.read_mode == "buffered" and not opts.fadvise
        self.write_cache_method = {
            ("direct", True): "O_DIRECT writes, fsync before close", ("direct", False): "O_DIRECT writes",
            ("buffered", True): "buffered writes, fsync before close",
            ("buffered", False): "none: buffered writes without fsync",
        }[(opts.write_mode, fsync)]
        self.writes_may_be_cached = opts.write_mode == "buffered" and not fsync

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path)

    def uri(self, path: str) -> str:
        return self._path(path)

    def prepare(self, directory: str) -> None:
        try:
            os.makedirs(self._path(directory), exist_ok=True)
        except OSError as exc:
            raise _os_error(self._path(directory), "cannot create directory", exc) from exc

    def open_writer(self, path: str, size: int) -> Writer:
        return PosixWriter(self._path(path), self.opts, self.fsync)

    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        return PosixReader(self._path(path), self.opts)

    def list_sizes(self, directory: str) -> dict[str, int]:
        return tree_sizes(self.root, directory)

    def write_marker(self, path: str, data: bytes) -> None:
        write_marker_file(self._path(path), data)

    def read_marker(self, path: str) -> Optional[bytes]:
        return read_marker_file(self._path(path))

    def create_marker(self, path: str, data: bytes) -> Optional[bool]:
        return create_marker_file(self._path(path), data)

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._path(path))

    def delete_file(self, path: str) -> bool:
        try:
            os.unlink(self._path(path))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _os_error(self._path(path), "cannot delete", exc) from exc
        return True

    def remove_empty_dir(self, directory: str) -> None:
        try:
            os.rmdir(self._path(directory))
        except OSError:
            pass  # not empty (files we did not write stay), or already gone

    def children(self, directory: str) -> list[str]:
        return entries(self._path(directory))

    def rename(self, src: str, dst: str) -> None:
        try:
            os.rename(self._path(src), self._path(dst))
        except OSError as exc:
            raise _os_error(self._path(src), f"cannot rename to {self._path(dst)}", exc) from exc

    def describe(self) -> dict:
        return {"storage_type": self.storage_type, "root": self.root,
                "write_mode": self.opts.write_mode, "read_mode": self.opts.read_mode,
                "fsync": self.fsync, "fadvise": self.opts.fadvise, **super().describe()}
