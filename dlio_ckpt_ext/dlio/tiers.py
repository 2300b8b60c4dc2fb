"""A tiered run's local tier among the ranks: opened and checked together, each
save confirmed whole on every rank before the older iteration goes (NVRx's
find_latest: an all-gather over the ranks; a barrier here)."""
from __future__ import annotations

import os
from typing import Callable, Optional

from dlio_ckpt_ext.shared_plans import tier_plan
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.checkpoint.local_tier import LocalTier
from dlio_ckpt_ext.config import RunConfig, local_path
from dlio_ckpt_ext.dlio.mpi import Topology
from dlio_ckpt_ext.engine import FileStats
from dlio_ckpt_ext.engine.stream import Progress
from dlio_ckpt_ext.errors import ConfigError


def open_local_tier(config: RunConfig, comm, topo: Topology, checkpointer: Checkpointer) -> LocalTier:
    """This rank's local tier; a ConfigError (the same on every rank) when its
    replication groups cannot tile the job."""
    t = config.tiers
    tier_plan.check_replication(comm.size, t.replication, tier_plan.jump(t.replication_jump, topo.ranks_per_node))
    return LocalTier(config, comm.rank, topo.ranks_per_node, checkpointer.rank_bytes, checkpointer.threads,
                     topo.cpu_share)


def refusal(tier: LocalTier, comm) -> Optional[str]:
    """Collective: why this rank cannot keep its local tier (None: it can).
    Room is what the node's ranks need together: O(ranks per node), on the node."""
    from mpi4py import MPI
    found = tier.refusal()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    need = node.allreduce(tier_plan.room_needed(tier.bytes_per_save))
    node.Free()
    return found or tier.room_refusal(need)


def same_device_note(config: RunConfig, checkpointer: Checkpointer) -> Optional[str]:
    """Said once by rank 0: the local tier and the storage under test are one file system."""
    root = local_path(checkpointer.root) if checkpointer.backend.has_directories else None
    if root is None or not os.path.exists(root):
        return None
    local = config.tiers.local_root
    if os.stat(local).st_dev != os.stat(root).st_dev:
        return None
    return (f"[WARNING] workload.tiers.local_root {local} is on the same file system as the checkpoint folder "
            f"{root}: the local saves and the persistent ones measure the same device, and each slows the other")


def save_local(tier: LocalTier, step: int, progress: Progress, barrier: Callable[[], None]) -> list[FileStats]:
    """One local checkpoint: the group's parts written and renamed, every rank
    confirmed whole, then the older iteration deleted (at most two are ever kept)."""
    files = tier.save(step, progress)
    barrier()
    tier.retire()
    return files


def open_for(session) -> None:
    """The local tier, refused on every rank together (a replication that
    cannot tile the job, another run's files, no room on a node)."""
    try:
        session.tier = open_local_tier(session.config, session.comm, session.topology, session.checkpointer)
    except ConfigError as exc:
        session._refuse_together(str(exc) if session.rank == 0 else None, gathered=False)
    with session.abort_on_error("checking the local tier"):
        refused = refusal(session.tier, session.comm)
    session._refuse_together(refused)
    with session.abort_on_error("preparing the local tier"):
        session.tier.buffers()
        if session.config.recovers:
            session.tier.read_buffers()
        if session.rank == 0:
            session.tier_note = same_device_note(session.config, session.checkpointer)
