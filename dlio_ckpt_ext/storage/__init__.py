"""Storage backends behind the engine's interface (engine/storage_interface.py), chosen by storage_type."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext.config import STORAGE_TYPES, join_root, structured  # noqa: F401 - join_root: storage's API
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.engine.storage_interface import Backend, Reader, Writer

__all__ = ["Backend", "Reader", "Writer", "open_backend"]


def open_backend(storage_type: str, root: str, options: dict, fsync: bool = True,
                 cpu_share: Optional[float] = None, layout: str = "") -> Backend:
    """The backend for `root` (a directory, or a URI for object storage);
    cpu_share: the CPUs the rank may use (sizes s3dlio's runtime; default all usable);
    layout: the checkpoint layout, whose framework's client storage_library=framework names."""
    prefix = "workload.storage.storage_options."
    if storage_type in ("local_fs", "parallel_fs", "direct_fs"):
        from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions
        if storage_type == "direct_fs" and root.startswith("direct://"):
            root = root[len("direct://"):]  # the fork's scheme for the same directory
        if "://" in root:
            raise ConfigError("workload.storage.storage_root", root,
                              f"a directory path for storage_type {storage_type} (URIs need storage_type s3)")
        opts = structured(PosixOptions, options, prefix)
        opts.check_storage_type(storage_type, prefix)
        return PosixBackend(root, opts, fsync, storage_type)
    if storage_type == "s3" and root.split("://", 1)[0] in ("az", "gs"):
        from dlio_ckpt_ext.storage import libraries
        from dlio_ckpt_ext.storage.cloud import CloudOptions
        opts = structured(CloudOptions, options, prefix)
        if libraries.resolve_cloud(root.split("://", 1)[0], opts.storage_library, layout) == "tensorstore":
            from dlio_ckpt_ext.storage.libraries.tensorstore_kv import TensorstoreGcsBackend
            return TensorstoreGcsBackend(root, opts)
        if root.startswith("az://"):
            from dlio_ckpt_ext.storage.azure_blob import AzureBackend
            return AzureBackend(root, opts)
        from dlio_ckpt_ext.storage.gcs import GcsBackend
        return GcsBackend(root, opts)
    if storage_type == "s3":
        from dlio_ckpt_ext.storage import libraries
        from dlio_ckpt_ext.storage.objstore import ObjectBackend, ObjectOptions
        opts = structured(ObjectOptions, options, prefix)
        library = libraries.resolve(opts.storage_library, layout)
        if library == "s3dlio":
            return ObjectBackend(root, opts, cpu_share)
        return libraries.backend_class(library)(root, opts, cpu_share)
    raise ConfigError("workload.storage.storage_type", storage_type, ", ".join(STORAGE_TYPES))
