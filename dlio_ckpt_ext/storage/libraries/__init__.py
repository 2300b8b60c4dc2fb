"""Object storage as each framework reaches it: its own client library
(storage_options.storage_library), behind the engine's interface.

s3dlio stays the default and MLPerf's; the others are the clients real jobs
write through (docs/object-storage.md, "Client libraries"): torch DCP's
s3torchconnector, Megatron's multi-storage-client, Orbax's TensorStore, and
minio, which MLCommons' fork offers. Each is imported only when chosen.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Optional

from dlio_ckpt_ext.errors import ConfigError

#: storage_library -> (the module it needs, its package on PyPI, our backend's module below)
LIBRARIES = {
    "s3dlio": ("s3dlio", "s3dlio", ""),
    "s3torchconnector": ("s3torchconnectorclient", "s3torchconnectorclient", "s3torch"),
    "minio": ("minio", "minio", "minio_client"),
    "msc": ("multistorageclient", "multi-storage-client", "msc"),
    "tensorstore": ("tensorstore", "tensorstore", "tensorstore_kv"),
}
FRAMEWORK = "framework"
#: checkpoint.layout -> the client its framework writes through (storage_library=framework)
FRAMEWORK_LIBRARY = {"dcp": "s3torchconnector", "megatron": "msc", "orbax": "tensorstore",
                     "deepspeed": "s3dlio", "safetensors": "s3dlio"}
#: what MLCommons' fork accepts as storage_library (its own checkpoint mechanisms' clients)
FORK_LIBRARIES = ("s3dlio", "minio", "s3torchconnector")
#: the libraries that also reach a cloud's own store, by scheme (TensorStore's gcs kvstore: Orbax's
#: native path); the others are S3 clients
CLOUD_LIBRARIES = {"gs": ("tensorstore",), "az": ()}
KEY = "workload.storage.storage_options.storage_library"


def choices() -> str:
    return ", ".join((*LIBRARIES, FRAMEWORK))


def resolve(library: Optional[str], layout: str = "") -> str:
    """The client library a run uses: `library` as given, `framework` the layout's
    framework's; refused in one line when unknown or not installed."""
    name = library or "s3dlio"
    if name == FRAMEWORK:
        name = FRAMEWORK_LIBRARY.get(layout, "s3dlio")
    if name not in LIBRARIES:
        raise ConfigError(KEY, library, choices())
    module, package, _ = LIBRARIES[name]
    if importlib.util.find_spec(module) is None:
        via = f" (storage_library=framework with checkpoint.layout={layout})" if library == FRAMEWORK else ""
        raise ConfigError(KEY, library, f"{choices()}; {name}{via} is not installed here: "
                                        f"pip install {package} (or pip install 'dlio-ckpt-ext[clients]')")
    return name


def resolve_cloud(scheme: str, library: Optional[str], layout: str = "") -> str:
    """The client library of an az:// or gs:// root: "" for the cloud's own SDK (unset, s3dlio as the
    fork's default, or `framework` where the framework's client is an S3 one), else one of
    CLOUD_LIBRARIES[scheme]; refused in one line naming the key and what the scheme takes."""
    name = FRAMEWORK_LIBRARY.get(layout, "s3dlio") if library == FRAMEWORK else library
    if name in (None, "s3dlio") or (library == FRAMEWORK and name not in CLOUD_LIBRARIES[scheme]):
        return ""
    if name not in CLOUD_LIBRARIES[scheme]:
        takes = ", ".join(("s3dlio (the SDK)", *CLOUD_LIBRARIES[scheme], FRAMEWORK))
        raise ConfigError(KEY, library, f"{takes} for {scheme}:// roots ({name} is an S3 client, for s3:// roots)")
    return resolve(name, layout)


def backend_class(name: str) -> type:
    """The backend class of client library `name` (not s3dlio's: storage/objstore.py)."""
    module = importlib.import_module(f"{__name__}.{LIBRARIES[name][2]}")
    return module.BACKEND
