"""The local S3 server for tests, plus an independent client (boto3) to check
what our code stored."""
import shutil
from pathlib import Path

import boto3
from botocore.config import Config

from dlio_ckpt_ext.tools.local_s3 import SECRET_KEY, LocalS3, free_port, start  # noqa: F401


def client(server: LocalS3):
    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))


class S3Server(LocalS3):
    def client(self):
        return client(self)


def start_s3_server(data_dir: Path, address: str = "127.0.0.1") -> S3Server:
    server = start(data_dir, address=address)
    return S3Server(server.endpoint, server.proc, server.data_dir, metrics_url=server.metrics_url)


def retire(server) -> None:
    """Stop a module's server and remove its data: SeaweedFS's volumes keep every object a module
    wrote (deletes leave them in place), 2-3 GB for some modules, until the session ends."""
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)
