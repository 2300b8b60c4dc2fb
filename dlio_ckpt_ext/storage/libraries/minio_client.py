"""MinIO's Python SDK, one of the clients MLCommons' fork offers
(storage_library=minio). Its put_object reads the object from a stream: our
bytes reach it through a bounded pipe, read by its upload thread, so nothing
is held whole. An object up to one part is one PUT; past it, 32 MiB parts,
max(2, ceil(16 / ranks)) uploading at once a rank: the fork's own settings
(pytorch_obj_store_checkpointing.py, which reads the job's size from the MPI
launcher's environment, as this does)."""
from __future__ import annotations

import os
import queue
import threading
from typing import Iterator, Optional
from urllib.parse import urlparse

from dlio_ckpt_ext.engine.storage_interface import Writer
from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage.libraries.library_backend import LibraryBackend
from dlio_ckpt_ext.storage.libraries.requests import parts

PART_SIZE = 32 << 20
#: the fork's target of uploads in flight over a node's ranks
TARGET_IN_FLIGHT = 16
#: chunks waiting in the pipe for the upload thread
PIPE_DEPTH = 2


def parallel_uploads(world: int | None = None) -> int:
    """Parts uploading at once a rank, as the fork sets them for a job of `world` ranks
    (default: the MPI launcher's environment, 1 without one)."""
    if world is None:
        world = next((int(os.environ[k]) for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
                      if os.environ.get(k, "").isdigit()), 1)
    return max(2, -(-TARGET_IN_FLIGHT // max(1, world)))


class _Aborted(Exception):
    pass


class Pipe:
    """The stream minio's put_object reads: chunks handed over by write(), a bounded few at a time."""

    def __init__(self) -> None:
        self._chunks: queue.Queue = queue.Queue(PIPE_DEPTH)
        self._left = memoryview(b"")
        self.aborted = False

    def put(self, data: Optional[bytes], reader: threading.Thread) -> None:
        while True:
            try:
                self._chunks.put(data, timeout=0.5)
                return
            except queue.Full:
                if not reader.is_alive():  # the upload failed: its error is said by close()
                    return

    def read(self, n: int = -1) -> bytes:
        out = []
        want = n if n >= 0 else 1 << 62
        while want > 0:
            if not self._left:
                chunk = self._chunks.get()
                if self.aborted:
                    raise _Aborted("the save was aborted")
                if chunk is None:
                    self._chunks.put(None)  # end of stream, for any later read
                    break
                self._left = memoryview(chunk)
            take = self._left[:want]
            self._left = self._left[len(take):]
            out.append(take)
            want -= len(take)
        return b"".join(out)


class MinioWriter(Writer):
    def __init__(self, backend: "MinioBackend", path: str, size: int) -> None:
        self.backend, self.uri, self.size = backend, backend.uri(path), size
        self.pipe, self.error = Pipe(), None
        self.thread = threading.Thread(target=self._upload, args=(backend.key(path),), daemon=True,
                                       name="minio-upload")
        self.thread.start()

    def _upload(self, key: str) -> None:
        try:
            with self.backend.errors(self.uri, "cannot upload"):
                self.backend.client().put_object(self.backend.bucket, key, self.pipe, self.size,
                                                 part_size=PART_SIZE, num_parallel_uploads=self.backend.uploads)
        except BaseException as exc:  # noqa: BLE001 - said by close()
            self.error = exc

    def write(self, data: memoryview) -> None:
        self.pipe.put(bytes(data), self.thread)  # the caller reuses its buffer

    def close(self) -> None:
        self.pipe.put(None, self.thread)
        self.thread.join()
        if self.error is not None:
            raise self.error if isinstance(self.error, StorageError) else StorageError(
                f"cannot upload {self.uri}: {self.error}")
        if self.size <= PART_SIZE:
            self.backend.counts.add("PUT")
        else:
            self.backend.counts.multipart(parts(self.size, PART_SIZE))

    def abort(self) -> None:
        # minio aborts its multipart upload when its stream raises
        self.pipe.aborted = True
        self.pipe.put(None, self.thread)
        self.thread.join(timeout=60)


class MinioBackend(LibraryBackend):
    library = "minio"
    write_cache_method = "none needed: a save ends when its uploads completed"
    read_cache_method = "none needed: every read is a request to the object server"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.uploads = parallel_uploads()

    def make_client(self):
        from minio import Minio
        url = urlparse(self.endpoint or "https://s3.amazonaws.com")
        return Minio(url.netloc, access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
                     secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"), region=self.region,
                     secure=url.scheme == "https")

    def missing(self, exc: BaseException) -> bool:
        return getattr(exc, "code", "") in ("NoSuchKey", "NoSuchObject") or "NoSuchKey" in str(exc)

    def open_writer(self, path: str, size: int) -> Writer:
        return MinioWriter(self, path, size)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.counts.add("GET")
        resp = self.client().get_object(self.bucket, key, offset=offset, length=length)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def head(self, key: str) -> int:
        self.counts.add("HEAD")
        return self.client().stat_object(self.bucket, key).size

    def get_whole(self, key: str) -> Optional[bytes]:
        self.counts.add("GET")
        try:
            resp = self.client().get_object(self.bucket, key)
        except Exception as exc:  # noqa: BLE001 - minio's S3Error says NoSuchKey
            if self.missing(exc):
                return None
            raise
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def list_names(self, prefix: str) -> Iterator[str]:
        for i, o in enumerate(self.client().list_objects(self.bucket, prefix=prefix, recursive=False)):
            if i % 1000 == 0:  # minio pages its ListObjectsV2 requests 1,000 keys a page
                self.counts.add("LIST")
            yield o.object_name

    def write_concurrency(self, chunk_size: int) -> dict:
        return {"requests_in_flight": self.uploads, "request_bytes": PART_SIZE,
                "note": "one file at a time; minio's upload threads send its parts"}

    def settings(self) -> dict:
        return {"part_size": PART_SIZE, "parallel_uploads": self.uploads, "files_at_once": 1}


BACKEND = MinioBackend
