"""The layouts a checkpoint can be written in, one module each, and the
registry that maps `checkpoint.layout` to its layout object. A new layout is a
module here (a Layout subclass and its LAYOUT) plus its presets; the rest of
the package asks the object (layouts.get) and never compares a layout's name."""
from __future__ import annotations

from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts import dcp, deepspeed, megatron, orbax, safetensors
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange

REGISTRY: dict[str, Layout] = {module.LAYOUT.name: module.LAYOUT for module in (deepspeed, dcp, safetensors, megatron, orbax)}
NAMES = tuple(REGISTRY)


def get(name: str) -> Layout:
    """The layout named `name` (checkpoint.layout), or a ConfigError naming the known ones."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError("checkpoint.layout", name, " or ".join(NAMES)) from None


def of(p: plan.Parallelism) -> Layout:
    """The layout a plan's parallelism names, in the variant its settings choose."""
    return get(p.layout).variant(p)


def rank_plan(m: plan.ModelShape, p: plan.Parallelism, world: int, rank: int) -> plan.RankPlan:
    """The files `rank` writes in one checkpoint of p's layout."""
    return of(p).rank_plan(m, p, world, rank)


def checkpoint_bytes(m: plan.ModelShape, p: plan.Parallelism, world: int) -> int:
    """Bytes of one whole checkpoint of p's layout, all ranks together."""
    return of(p).checkpoint_bytes(m, p, world)


def rank_reads(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> tuple[ReadRange, ...]:
    """The ranges `rank` of the loading job reads from a checkpoint of p's layout."""
    return of(p).rank_reads(m, p, job, rank)


def summary(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, read_size: int, share: str = "none") -> dict:
    """The whole loading job's counts (Layout.summary)."""
    return of(p).summary(m, p, job, read_size, share)
