"""Our storage backends offered to DLIO as DLIO storage classes.

DLIO makes its own storage calls for a checkpoint workload (it creates the
storage_root namespace, upstream counts the checkpoints with walk_node before
reading them, it deletes its data folder when keep_files is off). For a
workload that names our mechanism those calls go through the same backend the
mechanism writes with (POSIX or s3dlio), so DLIO needs neither
s3torchconnector nor a dataset format. DLIO's StorageFactory has no hook for
a storage class, so install() wraps it; the wrapper picks ours only for a
workload whose checkpoint_mechanism_classname is our mechanism.
"""
from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
import shutil
from typing import Callable, Optional

from dlio_benchmark.common.enumerations import MetadataType, NamespaceType, StorageType
from dlio_benchmark.storage.storage_handler import DataStorage, Namespace
from dlio_benchmark.utils.config import ConfigArguments

from omegaconf import OmegaConf

from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.config import MECHANISM_CLASS
from dlio_ckpt_ext.dlio import context
from dlio_ckpt_ext.dlio.provenance import dlio_is_mlcommons_fork
from dlio_ckpt_ext.storage import Backend, open_backend
from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions

OUR_TYPES = {"local_fs", "parallel_fs", "s3", "direct_fs"}


def _layout() -> str:
    """The running workload's checkpoint layout (storage_library=framework names its client)."""
    try:
        return str(OmegaConf.select(context.get_workload(), "checkpoint.layout", default="") or "")
    except RuntimeError:  # no workload of ours: a layout's client is never asked for
        return ""


class StreamingStorage(DataStorage):
    """DLIO's DataStorage interface over one of our backends, rooted at storage_root.

    DLIO walks its dataset through it too (training workflows): files, folders,
    subfolders and patterns. With storage_type s3 the dataset stays on a file
    system (dataset.data_folder, an absolute path): DLIO's data generators and
    readers open dataset files with local file APIs (np.savez/np.load, h5py,
    PIL, tf.data) at the path get_uri gives, whatever the storage type."""

    def __init__(self, storage_type: str, namespace: str, options: Optional[dict] = None,
                 data_folder: str = "") -> None:
        """data_folder: DLIO's dataset.data_folder."""
        super().__init__(None)  # no framework: its native I/O is never used here
        self.storage_type = storage_type
        self.backend: Backend = open_backend(storage_type, namespace, dict(options or {}), layout=_layout())
        kind = NamespaceType.FLAT if storage_type == "s3" else NamespaceType.HIERARCHICAL
        self.namespace = Namespace(namespace, kind)
        self.data_folder = posixpath.normpath(data_folder) if data_folder else ""
        #: s3: the dataset's own folder on a file system, and the backend that reaches it
        self.dataset_folder = self.data_folder if storage_type == "s3" and data_folder.startswith("/") else None
        self.dataset_backend: Optional[Backend] = PosixBackend("/", PosixOptions("buffered", "buffered"), False) \
            if self.dataset_folder else None

    def _route(self, id: str) -> tuple[Backend, str]:
        """The backend holding node `id`, and the id relative to it."""
        id = str(id)
        if self.dataset_folder and (id == self.dataset_folder or id.startswith(self.dataset_folder + "/")):
            return self.dataset_backend, posixpath.normpath(id)
        return self.backend, self._rel(id)

    def _rel(self, id: str) -> str:
        """A node id relative to the namespace (DLIO passes relative ids, or
        absolute paths below a local storage_root)."""
        root = self.backend.uri("").rstrip("/")
        id = str(id)
        if id == root or id in ("", ".", "./"):
            return ""
        if id.startswith(root + "/"):
            id = id[len(root) + 1:]
        id = posixpath.normpath(id)
        # an absolute local path stays absolute (the backend joins it as such)
        return id.lstrip("/") if self.storage_type == "s3" else id

    def _local(self, backend: Backend) -> bool:
        return backend is self.dataset_backend or self.storage_type != "s3"

    def get_uri(self, id: str) -> str:
        backend, rel = self._route(id)
        return backend.uri(rel)

    def create_namespace(self, exist_ok: bool = False) -> bool:
        self.backend.prepare("")
        return True

    def get_namespace(self) -> str:
        return self.namespace.name

    def create_node(self, id: str, exist_ok: bool = False) -> bool:
        backend, rel = self._route(id)
        backend.prepare(rel)
        return True

    def get_node(self, id: str = "") -> Optional[MetadataType]:
        backend, rel = self._route(id)
        if not rel:
            return MetadataType.DIRECTORY
        if self._local(backend):  # one stat, no listing
            path = backend.uri(rel)
            return MetadataType.DIRECTORY if os.path.isdir(path) else \
                MetadataType.FILE if os.path.exists(path) else None
        parent, name = posixpath.split(rel)
        if name not in backend.children(parent):
            return None
        return MetadataType.DIRECTORY if backend.children(rel) else MetadataType.FILE

    def walk_node(self, id: str, use_pattern: bool = False) -> list[str]:
        # DLIO counts the checkpoints here before reading them: an async run's
        # last checkpoint must have been persisted first.
        from dlio_ckpt_ext.dlio.interrupts import active_session
        session = active_session()
        if session is not None:
            session.drain()
        backend, rel = self._route(id)
        if not use_pattern:
            listed = backend.children(rel)
            if session is not None and rel == self._rel(ConfigArguments.get_instance().checkpoint_folder):
                return session.config.checkpoints_as_loaded(listed)
            return listed
        if self._local(backend):
            return sorted(glob.glob(backend.uri(rel)))
        return [backend.uri(key) for key in matching_keys(backend, rel)]

    def delete_node(self, id: str) -> bool:
        """Single files, and DLIO's dataset folder (DLIO removes it when
        keep_files is False, as its own storage does); never another tree."""
        backend, rel = self._route(id)
        if self._local(backend) and os.path.isdir(backend.uri(rel)):
            if not self.data_folder or posixpath.normpath(str(id)) != self.data_folder:
                return False
            shutil.rmtree(backend.uri(rel))
            return True
        return backend.delete_file(rel)

    def isfile(self, id: str) -> bool:
        return self.get_node(id) == MetadataType.FILE

    def get_basename(self, id: str) -> str:
        return posixpath.basename(str(id))

    def islocalfs(self) -> bool:
        return self.storage_type != "s3"


def matching_keys(backend: Backend, pattern: str) -> list[str]:
    """The object keys (relative to the backend's root) matching a glob pattern
    whose wildcards match within one path component, as a file system's glob:
    one listing below the pattern's fixed leading folders."""
    parts = pattern.split("/")
    fixed = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    base = "/".join(parts[:fixed])
    keys = backend.list_sizes(base) if fixed < len(parts) else {}
    return sorted(k for k in keys if len(k.split("/")) == len(parts)
                  and all(fnmatch.fnmatchcase(a, b) for a, b in zip(k.split("/"), parts)))


def ours(args: ConfigArguments) -> bool:
    """Whether the workload DLIO loaded names our mechanism (or a subclass path of it)."""
    name = getattr(args, "checkpoint_mechanism_classname", None) or ""
    return name == MECHANISM_CLASS or name.endswith(".StreamingCheckpointing")


_installed = False


def install() -> None:
    """Route DLIO's storage for our workloads through StreamingStorage, on both DLIOs."""
    global _installed
    if _installed:
        return
    from dlio_benchmark.storage import storage_factory

    dlio_get_storage = storage_factory.StorageFactory.get_storage

    def get_storage(storage_type, namespace, framework=None):
        args = ConfigArguments.get_instance()
        kind = str(storage_type.value if isinstance(storage_type, StorageType) else storage_type)
        if ours(args) and kind in OUR_TYPES:
            # DLIO 2.0.0 keeps no storage_options: take them from the workload
            options = OmegaConf.select(context.get_workload(), "storage.storage_options") or {}
            return StreamingStorage(kind, namespace, OmegaConf.to_container(options) if options else {},
                                    str(getattr(args, "data_folder", "") or ""))
        return dlio_get_storage(storage_type, namespace, framework)

    storage_factory.StorageFactory.get_storage = staticmethod(get_storage)

    ConfigArguments.validate = validating_as_ours(ConfigArguments.validate)
    if dlio_is_mlcommons_fork():
        _install_fork_storage_library()
    _installed = True


def validating_as_ours(dlio_validate: Callable) -> Callable:
    """DLIO's ConfigArguments.validate, run on our workloads with the settings
    of _validated_as in place of theirs, which it gets back after."""
    def validate(self, *a, **kw):
        shown = _validated_as(self)
        kept = {key: getattr(self, key) for key in shown}
        try:
            for key, value in shown.items():
                setattr(self, key, value)
            return dlio_validate(self, *a, **kw)
        finally:
            for key, value in kept.items():
                setattr(self, key, value)
    return validate


def _validated_as(args: ConfigArguments) -> dict:
    """The settings DLIO's validate() sees in place of our workload's own,
    where its checks are for code that does not run for our workload; it
    validates everything else as it does.

    - Upstream's requires s3torchconnector, an npz/npy dataset format and
      inline credentials whenever storage_type is s3 with pytorch: checks for
      its own S3 classes and dataset readers.
    - Upstream's and the fork's refuse more reads than writes in a run that
      writes: a model load reads its one publish for every load."""
    if not ours(args):
        return {}
    given = {}
    if args.storage_type == StorageType.S3:
        given["storage_type"] = StorageType.LOCAL_FS
    layout = layouts.REGISTRY.get(OmegaConf.select(context.get_workload(), "checkpoint.layout"))
    if layout is not None and layout.model_load \
            and getattr(args, "num_checkpoints_write", 0) > 0:  # DLIO 2.0.0 has neither key nor check
        given["num_checkpoints_read"] = min(args.num_checkpoints_read, args.num_checkpoints_write)
    return given


#: what DLIO itself may keep of our storage options: not the credentials
_SECRET_OPTIONS = ("access_key_id", "secret_access_key")


def _install_fork_storage_library() -> None:
    """MLCommons' fork picks its own checkpoint mechanism for storage_type s3
    from storage_options.storage_library, and stops without one. Our object
    I/O is s3dlio's (ObjectOptions.storage_library), so an unset one means
    s3dlio, as our storage options default to. The fork also copies AWS_*
    credentials from the environment into its storage_options and prints
    them at start-up; our backend takes them from the workload and the
    environment itself, so for our workloads DLIO keeps the options the
    workload gave, less the credentials."""
    import dlio_benchmark.main as dlio_main
    dlio_load_config = dlio_main.LoadConfig

    def load_config(args, config):
        dlio_load_config(args, config)
        if not ours(args):
            return
        given = OmegaConf.select(context.get_workload(), "storage.storage_options")
        options = {k: v for k, v in (OmegaConf.to_container(given) if given else {}).items()
                   if k not in _SECRET_OPTIONS}
        if args.storage_type == StorageType.S3:
            options.setdefault("storage_library", "s3dlio")
        args.storage_options = options

    dlio_main.LoadConfig = load_config
