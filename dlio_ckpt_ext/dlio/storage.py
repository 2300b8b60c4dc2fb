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
import posixpath
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

OUR_TYPES = {"local_fs", "parallel_fs", "s3", "direct_fs"}


class StreamingStorage(DataStorage):
    """DLIO's DataStorage interface over one of our backends, rooted at storage_root."""

    def __init__(self, storage_type: str, namespace: str, options: Optional[dict] = None) -> None:
        super().__init__(None)  # no framework: its native I/O is never used here
        self.storage_type = storage_type
        self.backend: Backend = open_backend(storage_type, namespace, dict(options or {}))
        kind = NamespaceType.FLAT if storage_type == "s3" else NamespaceType.HIERARCHICAL
        self.namespace = Namespace(namespace, kind)

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

    def get_uri(self, id: str) -> str:
        return self.backend.uri(self._rel(id))

    def create_namespace(self, exist_ok: bool = False) -> bool:
        self.backend.prepare("")
        return True

    def get_namespace(self) -> str:
        return self.namespace.name

    def create_node(self, id: str, exist_ok: bool = False) -> bool:
        self.backend.prepare(self._rel(id))
        return True

    def get_node(self, id: str = "") -> Optional[MetadataType]:
        rel = self._rel(id)
        parent, name = posixpath.split(rel)
        if not rel:
            return MetadataType.DIRECTORY
        if name not in self.backend.children(parent):
            return None
        return MetadataType.DIRECTORY if self.backend.children(rel) else MetadataType.FILE

    def walk_node(self, id: str, use_pattern: bool = False) -> list[str]:
        # DLIO counts the checkpoints here before reading them: an async run's
        # last checkpoint must have been persisted first.
        from dlio_ckpt_ext.dlio.session import active_session
        session = active_session()
        if session is not None:
            session.drain()
        rel = self._rel(id)
        if not use_pattern:
            listed = self.backend.children(rel)
            if session is not None and rel == self._rel(ConfigArguments.get_instance().checkpoint_folder):
                return session.config.checkpoints_as_loaded(listed)
            return listed
        parent, pattern = posixpath.split(rel)
        return [self.backend.uri(posixpath.join(parent, n)) for n in self.backend.children(parent)
                if fnmatch.fnmatch(n, pattern)]

    def delete_node(self, id: str) -> bool:
        """Only single files: a benchmark deletes what it wrote, never a tree."""
        return self.backend.delete_file(self._rel(id))

    def isfile(self, id: str) -> bool:
        return self.get_node(id) == MetadataType.FILE

    def get_basename(self, id: str) -> str:
        return posixpath.basename(str(id))

    def islocalfs(self) -> bool:
        return self.storage_type != "s3"


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
            return StreamingStorage(kind, namespace, OmegaConf.to_container(options) if options else {})
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
