"""Azure Blob Storage (az://CONTAINER/PREFIX) through azure-storage-blob.

An object is a block blob: its chunks are staged as blocks (Put Block) from
the buffers the generator filled, up to max_in_flight at once, then committed
in one Put Block List, so a failed or killed upload leaves no committed blob,
only uncommitted blocks, which `open_uploads` lists and `abort_uploads`
removes (Azure would drop them after a week). Credentials as the SDK's own
tools take them from the environment: AZURE_STORAGE_CONNECTION_STRING, or
AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN
(AZURE_STORAGE_BLOB_ENDPOINT for another endpoint than the account's).
"""
from __future__ import annotations

import logging
import os
from typing import Iterator, Optional

from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage.cloud import CloudBackend, CloudOptions
from dlio_ckpt_ext.storage.lent_blocks import LentBlockWriter
from dlio_ckpt_ext.storage.retries import COUNTS, THROTTLE_STATUS, backoff_s

#: Azure's limits: blocks per blob, blobs per batch request
MAX_BLOCKS, BATCH = 50_000, 256
_VARS = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY",
         "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_BLOB_ENDPOINT")


def block_id(index: int) -> str:
    # every id of a blob must have the same length (the SDK base64-encodes it)
    return f"{index:010d}"


def counting_retry(opts: CloudOptions):
    """The SDK's own exponential retry policy, telling each retry, throttle and
    give-up as it decides it (storage/retries.py); retry_backoff_s, when set,
    replaces its 15 s first wait (then 15 + 3^n s) by retry_backoff_s x 2^n."""
    from azure.storage.blob import ExponentialRetry

    class CountingRetry(ExponentialRetry):
        def increment(self, settings, request, response=None, error=None) -> bool:
            again = super().increment(settings, request, response=response, error=error)
            throttled = response is not None and (response.status_code in THROTTLE_STATUS
                                                  or response.headers.get("x-ms-error-code") == "ServerBusy")
            COUNTS.add(throttled=throttled, retried=again, gave_up=not again)
            return again

        def get_backoff_time(self, settings) -> float:
            if not opts.retry_backoff_s:
                return super().get_backoff_time(settings)
            return backoff_s(settings["count"] - 1, opts.retry_backoff_s)
    return CountingRetry(retry_total=opts.max_attempts - 1)


def service_client(opts: CloudOptions):
    """The SDK's client from the environment, or one line naming the variables."""
    from azure.storage.blob import BlobServiceClient
    env = {k: os.environ.get(k) for k in _VARS}
    kwargs = {"connection_timeout": opts.connect_timeout_s, "read_timeout": opts.operation_timeout_s,
              "retry_policy": counting_retry(opts)}
    try:
        if env["AZURE_STORAGE_CONNECTION_STRING"]:
            return BlobServiceClient.from_connection_string(env["AZURE_STORAGE_CONNECTION_STRING"], **kwargs)
        account = env["AZURE_STORAGE_ACCOUNT"]
        secret = env["AZURE_STORAGE_KEY"] and {"account_name": account, "account_key": env["AZURE_STORAGE_KEY"]}
        secret = secret or env["AZURE_STORAGE_SAS_TOKEN"]
        if account and secret:
            url = env["AZURE_STORAGE_BLOB_ENDPOINT"] or f"https://{account}.blob.core.windows.net"
            return BlobServiceClient(url, credential=secret, **kwargs)
    except ValueError as exc:  # a malformed connection string or key: the SDK says which
        raise StorageError(f"az://: the Azure credentials in the environment are malformed: {exc}") from None
    raise StorageError("az://: no Azure credentials: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT "
                       "with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN")


class BlockBlobWriter(LentBlockWriter):
    def __init__(self, backend: "AzureBackend", path: str, size: int) -> None:
        super().__init__(backend.uri(path), size, backend.opts.max_in_flight, ordered=False, spare=backend.spare)
        self.backend, self.path = backend, path
        self.blob = backend.container_client.get_blob_client(backend.key(path))

    def reserve(self, n: int) -> memoryview:
        if self._index == 0 and -(-self.size // n) > MAX_BLOCKS:
            raise StorageError(f"{self.uri}: {self.size} bytes in blocks of {n} would take more than Azure's "
                               f"{MAX_BLOCKS} blocks a blob; raise workload.streaming.chunk_size")
        return super().reserve(n)

    def send_block(self, index: int, offset: int, data: memoryview) -> None:
        with self.backend.errors(self.path, "cannot upload"):
            self.blob.stage_block(block_id(index), data, length=len(data))

    def finish(self, blocks: int) -> None:
        from azure.storage.blob import BlobBlock
        with self.backend.errors(self.path, "cannot complete upload of"):
            self.blob.commit_block_list([BlobBlock(block_id=block_id(i)) for i in range(blocks)])

    def discard(self) -> None:
        self.backend.remove_uncommitted(self.backend.key(self.path))


class AzureBackend(CloudBackend):
    scheme = "az"
    delete_batch = BATCH

    def __init__(self, root: str, opts: CloudOptions) -> None:
        super().__init__(root, opts)
        # DLIO sets the root logger to INFO, where the SDK logs every request and its headers
        logging.getLogger("azure").setLevel(logging.WARNING)
        self.service = service_client(opts)
        self.endpoint = self.service.url.rstrip("/")
        self.container_client = self.service.get_container_client(self.container)

    def classify(self, exc: BaseException) -> tuple[str, str]:
        from azure.core.exceptions import (ClientAuthenticationError, HttpResponseError, ResourceNotFoundError,
                                           ServiceRequestError, ServiceResponseError)
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, ResourceNotFoundError):
            return "missing", detail
        if isinstance(exc, ClientAuthenticationError) or getattr(exc, "status_code", None) in (401, 403):
            return "refused", detail
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return "gone", detail
        if isinstance(exc, HttpResponseError) and getattr(exc, "error_code", None):
            return "", f"{exc.error_code}: {detail}"
        return "", detail

    def _check_container(self) -> None:
        self.container_client.get_container_properties()

    def _sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        for blob in self.container_client.list_blobs(name_starts_with=prefix):
            yield blob.name, blob.size

    def _names(self, prefix: str) -> Iterator[str]:
        for item in self.container_client.walk_blobs(name_starts_with=prefix, delimiter="/"):
            yield item.name

    def _delete(self, keys: list[str]) -> int:
        answers = self.container_client.delete_blobs(*keys, raise_on_any_failure=False)
        deleted = 0
        for key, answer in zip(keys, answers):
            if answer.status_code in (200, 202):
                deleted += 1
            elif answer.status_code != 404:
                raise StorageError(f"cannot delete az://{self.container}/{key}: HTTP {answer.status_code} "
                                   f"{answer.reason}")
        return deleted

    def _put(self, key: str, data: bytes) -> None:
        self.container_client.upload_blob(key, data, overwrite=True)

    def _get(self, key: str, offset: int = 0, length: Optional[int] = None) -> Optional[bytes]:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
        try:
            return self.container_client.download_blob(key, offset=offset, length=length,
                                                       max_concurrency=1).readall()
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            if exc.status_code == 416:  # the object ends before offset: an early end, said by the caller
                return b""
            raise

    def _size(self, key: str) -> int:
        return self.container_client.get_blob_client(key).get_blob_properties().size

    def open_writer(self, path: str, size: int) -> BlockBlobWriter:
        return BlockBlobWriter(self, path, size)

    def open_uploads(self) -> list[dict]:
        """Blobs below the root that hold uncommitted blocks and no committed data."""
        prefix = self._dir_prefix("")
        with self.errors("", "cannot list the uncommitted blocks of"):
            committed = {b.name for b in self.container_client.list_blobs(name_starts_with=prefix)}
            everything = self.container_client.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"])
            return [{"key": b.name, "upload_id": "uncommitted blocks", "initiated": str(b.last_modified)}
                    for b in everything if b.name not in committed]

    def abort_uploads(self, uploads: list[dict]) -> int:
        for u in uploads:
            self.remove_uncommitted(u["key"])
        return len(uploads)

    def remove_uncommitted(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError
        blob = self.container_client.get_blob_client(key)
        with self.errors(key[len(self._dir_prefix("")):], "cannot remove the uncommitted blocks of"):
            try:
                blob.delete_blob()
            except ResourceNotFoundError:
                # Azure deletes no blob that has only uncommitted blocks: an empty commit makes one
                blob.commit_block_list([])
                blob.delete_blob()
