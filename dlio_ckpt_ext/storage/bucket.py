"""A bucket's control plane through boto3: listings and batched deletes.

s3dlio moves the bytes; its listing carries no sizes (a size is a HEAD per
object) and its delete is one request per object. At 1024 ranks and 20,480
objects those are the requests that dominate a run: ListObjectsV2 returns
every size with the names (1,000 per page), a delimiter listing names one
level, and DeleteObjects takes 1,000 keys a request. Same AWS_* environment
as s3dlio (endpoint, credentials, region), one client per process.
"""
from __future__ import annotations

import functools
import os
from typing import Iterator

from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.result_files import OWNER_FILE

#: the most keys S3's DeleteObjects accepts in one request
DELETE_BATCH = 1000


_ENV = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def client():
    """The process's client for the AWS_* environment as it is now (a client costs ~50 ms of CPU)."""
    return _client(*(os.environ.get(k) or None for k in _ENV))


@functools.lru_cache(maxsize=4)
def _client(endpoint: str | None, region: str | None, key: str | None, secret: str | None):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))


def split(uri: str) -> tuple[str, str]:
    """s3://bucket/key -> (bucket, key)."""
    if not uri.startswith("s3://"):
        raise StorageError(f"{uri}: give an s3://bucket/prefix URI")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def _pages(uri: str, **kwargs) -> Iterator[dict]:
    bucket, prefix = split(uri)
    try:
        yield from client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **kwargs)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - botocore's errors say what went wrong
        raise StorageError(f"cannot list {uri}: {exc}") from None


def sizes(uri: str) -> dict[str, int]:
    """Every object below the prefix uri (ending in '/'), key -> size: one request per 1,000."""
    return {o["Key"]: o["Size"] for page in _pages(uri) for o in page.get("Contents", [])}


def names(uri: str) -> list[str]:
    """The names one level below the prefix uri (ending in '/'), objects and
    "directories" alike: a delimiter listing, no HEAD."""
    start = len(split(uri)[1])
    out = set()
    for page in _pages(uri, Delimiter="/"):
        out.update(o["Key"][start:] for o in page.get("Contents", []))
        out.update(p["Prefix"][start:].rstrip("/") for p in page.get("CommonPrefixes", []))
    return sorted(n for n in out if n and n != OWNER_FILE)


def put(uri: str, data: bytes) -> None:
    """One small object (a marker), in one PutObject."""
    name, key = split(uri)
    try:
        client().put_object(Bucket=name, Key=key, Body=data)
    except Exception as exc:  # noqa: BLE001 - botocore's errors have no common base worth naming
        raise StorageError(f"cannot write {uri}: {exc}") from exc


def get(uri: str) -> bytes | None:
    """A small object's bytes, or None when there is none."""
    name, key = split(uri)
    try:
        return client().get_object(Bucket=name, Key=key)["Body"].read()
    except Exception as exc:  # noqa: BLE001
        if "NoSuchKey" in str(exc) or "404" in str(exc) or "Not Found" in str(exc):
            return None
        raise StorageError(f"cannot read {uri}: {exc}") from exc


def delete(uris: list[str]) -> int:
    """Delete the objects (one bucket's), DELETE_BATCH keys a request; the
    count of keys the store reports deleted (S3 reports a missing key deleted
    too). A key the store refuses fails the call, naming it."""
    if not uris:
        return 0
    bucket = split(uris[0])[0]
    keys = [split(u)[1] for u in uris]
    deleted = 0
    for i in range(0, len(keys), DELETE_BATCH):
        batch = keys[i:i + DELETE_BATCH]
        try:
            answer = client().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch],
                                                                    "Quiet": False})
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot delete s3://{bucket}/{batch[0]} and {len(batch) - 1} more: {exc}") from None
        errors = answer.get("Errors", [])
        if errors:
            e = errors[0]
            raise StorageError(f"cannot delete s3://{bucket}/{e.get('Key')}: {e.get('Code')} {e.get('Message')}"
                               + (f" (and {len(errors) - 1} more keys)" if len(errors) > 1 else ""))
        deleted += len(answer.get("Deleted", []))
    return deleted
