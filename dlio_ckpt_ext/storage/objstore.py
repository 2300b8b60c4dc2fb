"""Object storage through s3dlio: s3://, and its file:// and direct://.

S3 uploads stream as multipart uploads whose parts the generator fills in
place (reserve/commit: no pool buffer, no copy); file:// and direct:// stream
from the pool's buffers. az:// and gs:// are not s3dlio's here (0.10's Azure
writer holds the whole object in memory; it has no GCS writer): they go
through each cloud's SDK (cloud.py). s3dlio reads its endpoint and credentials from
the process environment at its first call, so options are applied there
before anything touches s3dlio.
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from typing import Optional

import s3dlio

from dlio_ckpt_ext.config import parse_size, s3_part_size
from dlio_ckpt_ext.engine.threads import usable_cpus
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.engine.storage_interface import Backend, Reader, Writer
from dlio_ckpt_ext.storage import bucket, s3dlio_log
from dlio_ckpt_ext.storage.allocator import FRESH_PAGES_FROM, reuse_freed_memory
from dlio_ckpt_ext.storage.ranged_reader import PlannedRangeReader
from dlio_ckpt_ext.storage.posix import entries, read_marker_file, tree_sizes, write_marker_file
from dlio_ckpt_ext.storage.upload_janitor import WATCH

SCHEMES = ("s3", "file", "direct")
#: how each part's payload is signed: UNSIGNED-PAYLOAD (what AWS's own CRT-based
#: clients send, with a CRC checksum, over HTTPS) or the SHA-256 of every part,
#: ~0.55 CPU-s per GiB on this machine (bench/cpu_bench.py)
PAYLOAD_SIGNING = ("unsigned", "sha256")
#: storage option -> (s3dlio's environment variable, s3dlio 0.10's default)
LIMITS = {"operation_timeout_s": ("S3DLIO_OPERATION_TIMEOUT_SECS", 60),
          "connect_timeout_s": ("S3DLIO_CONNECT_TIMEOUT_SECS", 20),
          "max_attempts": ("S3DLIO_MAX_RETRY_ATTEMPTS", 3)}
_ENV = {"endpoint_url": "AWS_ENDPOINT_URL", "region": "AWS_REGION",
        "access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY"}


@dataclass(frozen=True)
class ObjectOptions:
    endpoint_url: Optional[str] = None       # default: AWS_ENDPOINT_URL from the environment
    region: Optional[str] = None             # default: AWS_REGION
    access_key_id: Optional[str] = None      # default: AWS_ACCESS_KEY_ID (prefer the environment)
    secret_access_key: Optional[str] = None  # default: AWS_SECRET_ACCESS_KEY (prefer the environment)
    part_size: str = "16MiB"                 # multipart part size (under 32 MiB: see FRESH_PAGES_FROM)
    payload_signing: str = "unsigned"        # unsigned (UNSIGNED-PAYLOAD) | sha256 (each part hashed)
    max_in_flight: int = 16                  # parts of one object in client memory at once (see below)
    runtime_threads: int = 0                 # s3dlio runtime threads; 0 = the rank's CPU share
    # s3dlio's request limits (0 = its defaults, in parentheses), set on every rank
    operation_timeout_s: int = 0             # s3dlio's operation timeout, seconds (60)
    connect_timeout_s: int = 0               # opening a connection (20)
    max_attempts: int = 0                    # attempts per request, the first included (3)
    # count throttled and retried requests from s3dlio's debug log (storage/s3dlio_log.py); False leaves its log alone
    count_retries: bool = True
    # the client library the bytes go through (docs/object-storage.md, "Client libraries"): s3dlio
    # (MLPerf's, these options' other keys are its), s3torchconnector (torch DCP's), msc (Megatron's
    # multi-storage-client), tensorstore (Orbax's), minio, or framework: the layout's framework's client.
    # The others use their own part sizes and pools, as their frameworks do. MLCommons' fork requires
    # the key with storage_type s3 (s3dlio, minio or s3torchconnector)
    storage_library: str = "s3dlio"
    uri_scheme: Optional[str] = None         # the fork's scheme option: s3, file or direct; must match the root

    def validate(self, key: str) -> None:
        from dlio_ckpt_ext.storage.libraries import FRAMEWORK, LIBRARIES, choices
        if self.storage_library not in (*LIBRARIES, FRAMEWORK):
            raise ConfigError(key + "storage_library", self.storage_library, choices())
        if self.uri_scheme is not None and self.uri_scheme not in SCHEMES:
            raise ConfigError(key + "uri_scheme", self.uri_scheme, ", ".join(SCHEMES))
        s3_part_size(key + "part_size", self.part_size)
        if self.payload_signing not in PAYLOAD_SIGNING:
            raise ConfigError(key + "payload_signing", self.payload_signing, " or ".join(PAYLOAD_SIGNING))
        if self.max_in_flight < 1:
            raise ConfigError(key + "max_in_flight", self.max_in_flight, "a positive integer")
        for name in ("runtime_threads", *LIMITS):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 0:
                raise ConfigError(key + name, getattr(self, name), "0 (s3dlio's default) or a positive integer")

    def limits(self) -> dict[str, int]:
        """The request limits in force: ours where set, else the environment's, else s3dlio's."""
        return {name: getattr(self, name) or int(os.environ.get(env, default))
                for name, (env, default) in LIMITS.items()}


_NOT_FOUND = re.compile(r"not ?found|NoSuchKey|\b404\b", re.IGNORECASE)


_GONE = re.compile(r"connection refused|connection reset|broken pipe|error trying to connect|dispatch failure",
                   re.IGNORECASE)
_UNSIGNED_REFUSED = re.compile(r"UNSIGNED|content-?sha256|NotImplemented|MissingContentLength", re.IGNORECASE)


def _error(uri: str, action: str, exc: BaseException, waited: Optional[float] = None) -> StorageError:
    text = str(exc)
    if waited is not None and re.search(r"time ?d? ?out|timeout", text, re.IGNORECASE):
        # s3dlio names its per-attempt limit; what the rank really waited, attempts included, is this
        text += (f" (waited {waited:.1f} s in all, up to {os.environ.get(LIMITS['max_attempts'][0], '3')} "
                 "attempts; storage_options operation_timeout_s / max_attempts)")
    if isinstance(exc, s3dlio.ObjectNotFoundError) or _NOT_FOUND.search(text):
        return StorageError(f"missing checkpoint file {uri}")
    if _GONE.search(text):
        # s3dlio's own hint (check the endpoint URL) misleads when the endpoint answered until now
        return StorageError(f"{action} {uri}: the endpoint {os.environ.get('AWS_ENDPOINT_URL') or '(default)'} "
                            f"stopped answering ({_GONE.search(text)[0].lower()}); s3dlio said: {text}")
    if os.environ.get("S3DLIO_UNSIGNED_PAYLOAD") == "1" and _UNSIGNED_REFUSED.search(text):
        return StorageError(f"{action} {uri}: the endpoint refused unsigned payloads ({text}); set "
                            "workload.storage.storage_options.payload_signing=sha256")
    return StorageError(f"{action} {uri}: {text}")


@contextlib.contextmanager
def _errors(uri: str, action: str):
    """s3dlio raises plain RuntimeErrors: turn them into StorageErrors naming the object."""
    start = time.monotonic()
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - s3dlio's errors have no common base
        raise _error(uri, action, exc, time.monotonic() - start) from exc


def s3dlio_in_flight(max_in_flight: int) -> int:
    """s3dlio 0.10 holds up to 2n+1 parts in memory for max_in_flight=n
    (n uploading, about as many queued: measured by bench/s3_bench.py), so n
    is chosen to keep the parts held within our max_in_flight."""
    return max(1, (max_in_flight - 1) // 2)


class ObjectWriter(Writer):
    zero_copy = True

    def __init__(self, uri: str, part_size: int, max_in_flight: int, size: int) -> None:
        self.uri, self.size = uri, size
        WATCH.opening(uri)  # a rank killed while this upload is open leaves it to the watch
        with _errors(uri, "cannot start upload of"):
            self.writer = s3dlio.MultipartUploadWriter.from_uri(uri, part_size=part_size,
                                                                max_in_flight=s3dlio_in_flight(max_in_flight),
                                                                abort_on_drop=True)

    def reserve(self, n: int) -> memoryview:
        with _errors(self.uri, "cannot upload"):
            return self.writer.reserve(n)

    def commit(self, n: int) -> None:
        with _errors(self.uri, "cannot upload"):
            self.writer.commit(n)

    def write(self, data: memoryview) -> None:
        with _errors(self.uri, "cannot upload"):
            self.writer.write(data, copy=True)  # the caller reuses its buffer

    def close(self) -> None:
        with _errors(self.uri, "cannot complete upload of"):
            info = self.writer.close()
        WATCH.done(self.uri)
        if info.get("total_bytes") != self.size:
            raise StorageError(f"upload of {self.uri} stored {info.get('total_bytes')} bytes, expected {self.size}")

    def abort(self) -> None:
        try:
            self.writer.abort()
        except Exception:  # noqa: BLE001 - best effort: the original error is what matters
            return  # still open: left to the rank's watch (and `dlio-ckpt-report uploads`)
        WATCH.done(self.uri)


class StreamWriter(Writer):
    """file:// and direct:// through s3dlio's filesystem writers, which write
    straight from the caller's buffer and release it when the call returns."""

    def __init__(self, uri: str, size: int) -> None:
        self.uri, self.size = uri, size
        make = s3dlio.create_direct_filesystem_writer if uri.startswith("direct://") \
            else s3dlio.create_filesystem_writer
        with _errors(uri, "cannot create"):
            self.writer = make(uri)

    def write(self, data: memoryview) -> None:
        with _errors(self.uri, "cannot write"):
            self.writer.write_chunk(data)

    def close(self) -> None:
        try:
            written = self.writer.finalize()[0]
        except Exception as exc:
            self.abort()
            raise _error(self.uri, "cannot complete", exc) from exc
        if written != self.size:
            raise StorageError(f"{self.uri} has {written} bytes written, expected {self.size}")

    def abort(self) -> None:
        try:
            self.writer.finalize()
        except Exception:  # noqa: BLE001 - the file is deleted next either way
            pass
        try:
            s3dlio.delete(self.uri)
        except Exception:  # noqa: BLE001
            pass


def object_reader(uri: str, size: Optional[int] = None) -> PlannedRangeReader:
    """Ranged GETs through s3dlio, whose bytes stay in its memory."""
    def get_range(offset: int, length: int) -> bytes:
        with _errors(uri, "cannot read"):
            return s3dlio.get_range(uri, offset, length)

    def stat() -> int:
        with _errors(uri, "cannot stat"):
            return int(s3dlio.stat(uri)["size"])
    return PlannedRangeReader(uri, size, get_range, stat)


class ObjectBackend(Backend):
    def __init__(self, root: str, opts: ObjectOptions, cpu_share: Optional[float] = None) -> None:
        if opts.uri_scheme and "://" not in root:  # mlpstorage passes the bucket, the scheme apart
            root = f"{opts.uri_scheme}://{root.lstrip('/') if opts.uri_scheme == 's3' else root}"
        scheme = root.split("://", 1)[0] if "://" in root else ""
        if opts.uri_scheme and scheme != opts.uri_scheme:
            raise ConfigError("workload.storage.storage_options.uri_scheme", opts.uri_scheme,
                              f"{scheme} (the scheme of storage_root {root}), or unset")
        if scheme not in SCHEMES:
            raise ConfigError("workload.storage.storage_root", root,
                              "a URI starting with " + ", ".join(f"{s}://" for s in (*SCHEMES, "az", "gs")))
        self.root, self.scheme, self.opts = root.rstrip("/"), scheme, opts
        self.lends_write_memory = scheme == "s3"  # multipart parts are filled in place
        self.lends_read_memory = True  # ranged GETs are read where s3dlio put them
        self.has_directories = scheme != "s3"
        self.part_size = parse_size("part_size", opts.part_size)
        share = usable_cpus() if cpu_share is None else cpu_share
        self.runtime_threads = opts.runtime_threads or max(1, int(share + 1e-9))
        # Before s3dlio's first call: it sizes its runtime and client then, once.
        for key, env in _ENV.items():
            if getattr(opts, key):
                os.environ[env] = getattr(opts, key)
        os.environ["S3DLIO_RT_THREADS"] = str(self.runtime_threads)
        for name, (env, _) in LIMITS.items():
            if getattr(opts, name):
                os.environ[env] = str(getattr(opts, name))
        if opts.payload_signing == "unsigned":
            os.environ["S3DLIO_UNSIGNED_PAYLOAD"] = "1"
        else:
            os.environ.pop("S3DLIO_UNSIGNED_PAYLOAD", None)
        self.freed_memory_reused = reuse_freed_memory()
        if scheme == "s3":
            WATCH.start()  # now (not in the first timed save), with the credentials just set
        local = scheme in ("file", "direct")
        self.reads_may_be_cached = local
        self.read_cache_method = ("none: file:// and direct:// reads may come from the page cache" if local
                                  else "none needed: every read is a request to the object server")
        self.write_cache_method = ("none: file:// and direct:// writes are not synced" if local
                                   else "none needed: a save ends when its uploads completed")
        self.writes_may_be_cached = local

    def uri(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def prepare(self, directory: str) -> None:
        if self.scheme in ("file", "direct"):
            try:
                os.makedirs(self._local(directory), exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create directory {self.uri(directory)}: {exc.strerror}") from exc

    def probe(self) -> None:
        """One cheap request that fails fast on a wrong endpoint, credentials or bucket."""
        try:
            s3dlio.list(self.uri("") + "/")
        except Exception as exc:
            raise StorageError(f"cannot reach {self.root} (endpoint {os.environ.get('AWS_ENDPOINT_URL')}): "
                               f"{exc}") from exc

    def open_writer(self, path: str, size: int) -> Writer:
        if self.scheme == "s3":
            return ObjectWriter(self.uri(path), self.part_size, self.opts.max_in_flight, size)
        return StreamWriter(self.uri(path), size)

    def open_reader(self, path: str, size: Optional[int] = None) -> Reader:
        return object_reader(self.uri(path), size)

    def _local(self, path: str = "") -> str:
        """file:// and direct://: the local path of `path`."""
        return self.uri(path).split("://", 1)[1]

    def list_sizes(self, directory: str) -> dict[str, int]:
        """S3: the listing's own sizes (ListObjectsV2, 1,000 objects a request; no HEAD)."""
        if self.scheme != "s3":
            return tree_sizes(self._local(), directory)
        found = bucket.sizes(self.uri(directory) + "/")
        prefix = bucket.split(self.root)[1]
        prefix = prefix + "/" if prefix else ""
        return {key[len(prefix):]: size for key, size in found.items()}

    def children(self, directory: str) -> list[str]:
        """S3: one delimiter listing of names (no HEAD)."""
        if self.scheme != "s3":
            return entries(self._local(directory))
        return bucket.names(self.uri(directory).rstrip("/") + "/")

    def delete_files(self, paths: list[str]) -> int:
        """S3: DeleteObjects, 1,000 keys a request."""
        if self.scheme != "s3":
            return super().delete_files(paths)
        return bucket.delete([self.uri(p) for p in paths])

    def write_marker(self, path: str, data: bytes) -> None:
        if self.scheme == "s3":
            bucket.put(self.uri(path), data)
        else:
            write_marker_file(self._local(path), data)

    def read_marker(self, path: str) -> Optional[bytes]:
        return bucket.get(self.uri(path)) if self.scheme == "s3" else read_marker_file(self._local(path))

    def exists(self, path: str) -> bool:
        """S3: one HEAD."""
        if self.scheme != "s3":
            return os.path.isfile(self._local(path))
        try:
            s3dlio.stat(self.uri(path))
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, s3dlio.ObjectNotFoundError) or _NOT_FOUND.search(str(exc)):
                return False
            raise _error(self.uri(path), "cannot stat", exc) from exc
        return True

    def delete_file(self, path: str) -> bool:
        uri = self.uri(path)
        try:
            s3dlio.delete(uri)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, s3dlio.ObjectNotFoundError) or _NOT_FOUND.search(str(exc)):
                return False
            raise _error(uri, "cannot delete", exc) from exc
        return True

    def open_uploads(self) -> list[dict]:
        if self.scheme != "s3":
            return []
        from dlio_ckpt_ext.storage.uploads import open_uploads
        return open_uploads(self.root + "/")

    def abort_uploads(self, uploads: list[dict]) -> int:
        from dlio_ckpt_ext.storage.uploads import abort_uploads
        return abort_uploads(self.root, uploads)

    def rename(self, src: str, dst: str) -> None:
        try:
            os.rename(self._local(src), self._local(dst))
        except OSError as exc:
            raise StorageError(f"cannot rename {self.uri(src)} to {self.uri(dst)}: {exc.strerror}") from exc

    def remove_empty_dir(self, directory: str) -> None:
        if self.scheme in ("file", "direct"):
            try:
                os.rmdir(self._local(directory))
            except OSError:
                pass

    def start_retry_counting(self) -> None:
        if self.scheme == "s3" and self.opts.count_retries:
            s3dlio_log.start()

    def retry_counts(self) -> Optional[dict]:
        return s3dlio_log.counts() if self.scheme == "s3" else None

    def write_concurrency(self, chunk_size: int) -> dict:
        if self.scheme != "s3":
            return super().write_concurrency(chunk_size)
        return {"requests_in_flight": s3dlio_in_flight(self.opts.max_in_flight), "request_bytes": self.part_size,
                "note": "per object, at most one part per part_size piece of it"}

    def describe(self) -> dict:
        return {"storage_type": "s3", "root": self.root, "scheme": self.scheme,
                "endpoint_url": os.environ.get("AWS_ENDPOINT_URL"), "region": os.environ.get("AWS_REGION"),
                "part_size": self.part_size, "max_in_flight": self.opts.max_in_flight,
                "s3dlio_max_in_flight": s3dlio_in_flight(self.opts.max_in_flight),
                "s3dlio_runtime_threads": self.runtime_threads, "payload_signing": self.opts.payload_signing,
                **self.opts.limits(),
                "freed_memory_reused": self.freed_memory_reused, **super().describe()}

    def chunk_warning(self, chunk_size: int) -> Optional[str]:
        if self.scheme != "s3" or chunk_size < FRESH_PAGES_FROM:
            return None
        return (f"[WARNING] streaming.chunk_size {chunk_size >> 20} MiB on S3: s3dlio allocates each part that "
                f"size anew, and glibc maps {FRESH_PAGES_FROM >> 20} MiB or more fresh each time (a page fault per "
                "4 KiB: client CPU the storage does not cost); keep it under 32 MiB (default: the part size, 16 MiB)")
