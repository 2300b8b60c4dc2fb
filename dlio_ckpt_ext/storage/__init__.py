"""Storage backends behind one interface (see base.py), chosen by storage_type."""
from __future__ import annotations

import posixpath

from dlio_ckpt_ext.config import structured
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.storage.base import Backend, Reader, Writer

__all__ = ["Backend", "Reader", "Writer", "open_backend"]


def open_backend(storage_type: str, root: str, options: dict, fsync: bool = True,
                 ranks_per_node: int = 1) -> Backend:
    """The backend for `root` (a directory, or a URI for object storage)."""
    prefix = "workload.storage.storage_options."
    if storage_type in ("local_fs", "parallel_fs"):
        from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions
        if "://" in root:
            raise ConfigError("workload.storage.storage_root", root,
                              f"a directory path for storage_type {storage_type} (URIs need storage_type s3)")
        return PosixBackend(root, structured(PosixOptions, options, prefix), fsync)
    if storage_type == "s3":
        from dlio_ckpt_ext.storage.objstore import ObjectBackend, ObjectOptions
        return ObjectBackend(root, structured(ObjectOptions, options, prefix), ranks_per_node)
    raise ConfigError("workload.storage.storage_type", storage_type, "local_fs, parallel_fs, s3")


def join_root(storage_root: str, folder: str) -> str:
    """storage_root/checkpoint_folder for paths and URIs alike."""
    if "://" in storage_root:
        return storage_root.rstrip("/") + "/" + folder.strip("/")
    return posixpath.join(storage_root, folder)
