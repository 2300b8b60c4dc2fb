"""The local tier of a two-tier run, as NVIDIA's resiliency extension writes it.

nvidia-resiliency-ext's `checkpointing/local` (read at d8686d9, docs/tiers.md):
each rank saves `iter_{7 digits}_{rank}_local.pt` under `<root>/<session>/<rank>/`
(the session name is empty by default), first as `..._local.dirty.pt`, renamed
once written; with replication (`replication/strategies.py`) a rank keeps the
parts of its group, F ranks `jump` apart (default: the GPUs of a node, so
the copies live on other nodes), all gathered over the network first, and
the world size must be a multiple of jump x F. The older iterations are
deleted once the new one is whole on every rank: two iterations at most.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from dlio_ckpt_ext.errors import ConfigError

#: iterations a rank's local folder holds at most (the new one, written before the old goes)
ITERATIONS_KEPT = 2


def local_name(step: int, rank: int, dirty: bool = False) -> str:
    """The local file of `rank`'s part of iteration `step` (its name while written, when dirty)."""
    return f"iter_{step:07d}_{rank}_local{'.dirty' if dirty else ''}.pt"


_LOCAL = re.compile(r"iter_(?P<step>\d{7,})_(?P<rank>\d+)_local\.pt")


def parse_local(name: str) -> Optional[tuple[int, int]]:
    """(iteration, owner) of a whole local file's name; None for a .dirty one or anything else."""
    m = _LOCAL.fullmatch(name)
    return (int(m["step"]), int(m["rank"])) if m else None


def rank_folder(rank: int) -> str:
    """A rank's folder below the local root (NVRx's <session>/<rank>, with the default empty session)."""
    return str(rank)


def jump(replication_jump: int, ranks_per_node: int) -> int:
    """Ranks between the members of a replication group (0: the ranks of a node, NVRx's default)."""
    return replication_jump or ranks_per_node


def check_replication(size: int, factor: int, apart: int) -> None:
    """NVRx's own refusal: groups of `factor` ranks `step` apart must tile the job."""
    if size % (factor * apart):
        raise ConfigError("workload.tiers.replication", factor,
                          f"a factor whose groups tile the {size} ranks: with ranks {apart} apart "
                          f"(tiers.replication_jump, 0 = ranks per node) the job must be a multiple of "
                          f"{apart} x replication; set replication_jump=1 to keep the copies on a node")


def group(rank: int, factor: int, apart: int) -> tuple[int, ...]:
    """The ranks whose parts `rank` keeps locally, its own first."""
    block = factor * apart
    base = rank // block * block + rank % apart
    members = [base + i * apart for i in range(factor)]
    return (rank,) + tuple(m for m in members if m != rank)


def local_bytes(rank: int, factor: int, apart: int, part: Callable[[int], int]) -> int:
    """Bytes `rank` writes in each local checkpoint: its group's parts."""
    return sum(part(r) for r in group(rank, factor, apart))


def room_needed(per_rank_bytes: int) -> int:
    """What a rank needs free on its local root: two iterations of its parts."""
    return ITERATIONS_KEPT * per_rank_bytes


def node_bytes(node: int, ranks_per_node: int, size: int, per_rank: Callable[[int], int]) -> int:
    """Bytes the ranks of node `node` (numbered by blocks of ranks_per_node, as mpirun maps by slot) hold."""
    return sum(per_rank(r) for r in range(node * ranks_per_node, min(size, (node + 1) * ranks_per_node)))
