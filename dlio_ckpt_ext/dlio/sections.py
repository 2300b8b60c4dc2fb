"""Which sections a workload config may have: DLIO's and ours.

DLIO reads its sections by name and silently ignores any other, so a typo
(`workload.stroage`, `workload.checkpoints`) would run with defaults. The
names DLIO knows are read from the installed DLIO's own LoadConfig, so they
follow whichever DLIO runs; keys inside our sections are checked by
config.py's schema.
"""
from __future__ import annotations

import functools
import inspect
import re

from omegaconf import DictConfig

from dlio_ckpt_ext.config import WorkloadSections
from dlio_ckpt_ext.errors import ConfigError


@functools.lru_cache(maxsize=1)
def dlio_sections() -> frozenset[str]:
    from dlio_benchmark.utils.config import LoadConfig
    return frozenset(re.findall(r"'(\w+)' in config\b(?!\[)", inspect.getsource(LoadConfig)))


def allowed_sections() -> list[str]:
    return sorted(dlio_sections() | set(WorkloadSections.__dataclass_fields__))


def check_sections(workload: DictConfig) -> None:
    allowed = allowed_sections()
    for key in workload:
        if key not in allowed:
            raise ConfigError(f"workload.{key}", workload[key],
                              "a section DLIO or dlio-ckpt-ext defines: " + ", ".join(allowed))
