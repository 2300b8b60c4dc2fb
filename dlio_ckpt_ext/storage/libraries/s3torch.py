"""torch DCP's client: AWS's s3torchconnector (its S3StorageWriter and
S3StorageReader sit on s3torchconnectorclient's MountpointS3Client, over the
CRT). Every upload is multipart in 8 MiB parts, a tiny file too; a ranged GET
is split by the CRT into 8 MiB GETs; DCP writes one file at a time a rank
(thread_count 1). The client is one a process, as s3torchconnector keeps it."""
from __future__ import annotations

from typing import Iterator, Optional

from dlio_ckpt_ext.engine.storage_interface import Writer
from dlio_ckpt_ext.storage.libraries.library_backend import LibraryBackend
from dlio_ckpt_ext.storage.libraries.requests import parts

#: s3torchconnector's S3ClientConfig default part size (s3client_config.py)
PART_SIZE = 8 << 20


class S3TorchWriter(Writer):
    def __init__(self, backend: "S3TorchBackend", path: str, size: int) -> None:
        self.backend, self.uri, self.size, self.sent = backend, backend.uri(path), size, 0
        with backend.errors(self.uri, "cannot start upload of"):
            self.stream = backend.client().put_object(backend.bucket, backend.key(path))

    def write(self, data: memoryview) -> None:
        with self.backend.errors(self.uri, "cannot upload"):
            self.stream.write(bytes(data))  # it takes bytes only: s3torchconnector's S3Writer copies too
        self.sent += len(data)

    def close(self) -> None:
        with self.backend.errors(self.uri, "cannot complete upload of"):
            self.stream.close()
        self.backend.counts.multipart(parts(self.sent, PART_SIZE))

    def abort(self) -> None:
        # a stream dropped unclosed is aborted by the CRT (CreateMultipartUpload, AbortMultipartUpload)
        self.stream = None
        self.backend.counts.add("CreateMultipartUpload")
        self.backend.counts.add("AbortMultipartUpload")


class S3TorchBackend(LibraryBackend):
    library = "s3torchconnector"
    renames_objects = True  # DCP's S3FileSystem.rename: a copy, then a delete
    write_cache_method = "none needed: a save ends when its multipart uploads completed"
    read_cache_method = "none needed: every read is a request to the object server"

    def make_client(self):
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client
        # path style: what S3ClientConfig(force_path_style=True) gives an S3-compatible endpoint
        return MountpointS3Client(self.region, part_size=PART_SIZE, endpoint=self.endpoint or None,
                                  force_path_style=bool(self.endpoint))

    def missing(self, exc: BaseException) -> bool:
        text = str(exc)
        return "does not exist" in text or "not found" in text.lower() or "NoSuchKey" in text

    def open_writer(self, path: str, size: int) -> Writer:
        return S3TorchWriter(self, path, size)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        chunks = list(self.client().get_object(self.bucket, key, offset, offset + length))
        self.counts.add("GET", parts(length, PART_SIZE))
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def rename(self, src: str, dst: str) -> None:
        """S3FileSystem.rename: the CRT's copy (it asks the source's size first: a HEAD), then a delete."""
        with self.errors(self.uri(src), f"cannot rename to {self.uri(dst)}"):
            self.client().copy_object(self.bucket, self.key(src), self.bucket, self.key(dst))
            self.counts.add("HEAD")
            self.counts.add("COPY")
            self.client().delete_object(self.bucket, self.key(src))
            self.counts.add("DELETE")

    def head(self, key: str) -> int:
        self.counts.add("HEAD")
        return self.client().head_object(self.bucket, key).size

    def get_whole(self, key: str) -> Optional[bytes]:
        self.counts.add("GET")  # a marker: one part
        try:
            return b"".join(self.client().get_object(self.bucket, key))
        except Exception as exc:  # noqa: BLE001 - the CRT's S3Exception says a missing key in its text
            if self.missing(exc):
                return None
            raise

    def list_names(self, prefix: str) -> Iterator[str]:
        for page in self.client().list_objects(self.bucket, prefix, "/"):
            self.counts.add("LIST")
            yield from (o.key for o in page.object_info)
            yield from page.common_prefixes

    def write_concurrency(self, chunk_size: int) -> dict:
        return {"requests_in_flight": 1, "request_bytes": PART_SIZE,
                "note": "one file at a time (DCP's thread_count 1); the CRT sends its parts"}

    def read_concurrency(self, requests_in_flight: int, request_bytes: int) -> dict:
        return {"requests_in_flight": requests_in_flight * parts(request_bytes, PART_SIZE),
                "request_bytes": min(request_bytes, PART_SIZE),
                "note": "the engine's ranged reads, each split by the CRT into 8 MiB GETs"}

    def settings(self) -> dict:
        return {"part_size": PART_SIZE, "files_at_once": 1, "client": "MountpointS3Client (CRT), one a process"}


BACKEND = S3TorchBackend
