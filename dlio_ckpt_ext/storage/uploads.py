"""Find, and optionally abort, multipart uploads left open under an S3 prefix.

A run aborts its own open uploads on any failure and on SIGINT/SIGTERM, and
each rank's upload watch (storage/upload_janitor.py, which uses the two
calls below) aborts what a killed rank left open. What neither can clean:
uploads open when the server itself went away mid-upload (the abort
requests fail too) or when the whole node died. Those parts stay on the
server, invisible to listings and billed by real stores, until aborted here.
s3dlio has no call for listing multipart uploads, so this uses boto3 with
the same AWS_* environment (AWS_ENDPOINT_URL, credentials, AWS_REGION).
"""
from __future__ import annotations

from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage.bucket import client, split


def open_uploads(uri: str) -> list[dict]:
    """[{key, upload_id, initiated}] of the multipart uploads open under s3://bucket/prefix."""
    bucket, prefix = split(uri)
    c = client()
    out, kwargs = [], {"Bucket": bucket, "Prefix": prefix}
    try:
        while True:
            page = c.list_multipart_uploads(**kwargs)
            out += [{"key": u["Key"], "upload_id": u["UploadId"], "initiated": str(u.get("Initiated"))}
                    for u in page.get("Uploads", [])]
            if not page.get("IsTruncated"):
                return out
            kwargs.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])
    except Exception as exc:  # noqa: BLE001 - botocore's errors say what went wrong
        raise StorageError(f"cannot list the multipart uploads of {uri}: {exc}") from None


def abort_uploads(uri: str, uploads: list[dict]) -> int:
    bucket = split(uri)[0]
    c = client()
    for u in uploads:
        c.abort_multipart_upload(Bucket=bucket, Key=u["key"], UploadId=u["upload_id"])
    return len(uploads)
