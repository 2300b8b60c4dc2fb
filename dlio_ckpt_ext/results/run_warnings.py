"""The warnings at the end of a run's RESULTS: what a reader of the figures must
know about how they were measured."""
from __future__ import annotations

from dlio_ckpt_ext.dlio import records, trace
from dlio_ckpt_ext.results import phases, tiers, windows
from dlio_ckpt_ext.dlio.mpi import Topology

PHASES = ("save", "load")


def generation_limited_warning(steps: dict[int, list[int]], topo: Topology) -> str:
    """Which ranks' save figures were their generators', and what would help on
    this node: a wider binding only where the node has CPUs the binding withholds."""
    all_steps = sorted({s for rank_steps in steps.values() for s in rank_steps})
    head = (f"[WARNING] generation limited the save of checkpoint step(s) {windows.listed(all_steps)} on rank(s) "
            f"{windows.listed(sorted(steps))}: at the generator thread limit, files carrying most of the checkpoint's "
            f"bytes took longer to generate than to write (rank 0 may run on {topo.cpu_mask_size} CPU(s), "
            f"its share {topo.cpu_share:g}; binding: {topo.binding}); ")
    per_rank = topo.node_cpus // max(1, topo.ranks_per_node)
    if per_rank > int(topo.cpu_share):
        return head + (f"give each rank more CPUs: mpirun --bind-to none, or --map-by "
                       f"ppr:{topo.ranks_per_node}:node:PE={per_rank}")
    return head + (f"this node's {topo.node_cpus} CPU(s) are all its {topo.ranks_per_node} rank(s) can have: run "
                   "fewer ranks per node or on nodes with more CPUs; these figures are the generator's, not the "
                   "storage's")


def runs(values: list[int]) -> str:
    """[1, 1, 1, 2, 2] -> '1 x3, 2 x2'."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(f"{v} x{n}" for v, n in out)


def warnings(session) -> list[str]:
    """What a reader of a run's figures must know about how they were measured (`session`: the CheckpointSession)."""
    out = []
    c, backend = session.config.checkpoint, session.checkpointer.backend
    if not session.rank_sync:
        out.append("[WARNING] checkpoint.rank_sync is False: DLIO times each checkpoint on rank 0 alone; "
                   "the global windows (first rank's start to last rank's close) are in "
                   f"{records.RECORD_FILE}")
    if session.config.is_async and session.dlio_reports_metrics and c.num_checkpoints_write:
        how = "workload.tiers" if session.config.has_tiers else "checkpoint.async_mode=async"
        out.append(f"[WARNING] {how}: DLIO's own [METRIC] save lines time the save call "
                   "(generating the content, staging, waiting for the previous persist), not storage; the "
                   "storage figures are the 'Checkpoint persist' lines, "
                   + ("the local saves and the foreground's cost the TIERS block" if session.config.has_tiers
                      else "the blocked time the 'save blocked' lines"))
    if c.num_checkpoints_write and backend.writes_may_be_cached:
        out.append("[WARNING] save figures may measure the page cache, not the storage "
                   f"(write method: {backend.write_cache_method})")
    if c.num_checkpoints_read and backend.reads_may_be_cached:
        out.append("[WARNING] reads may be served from the page cache "
                   f"(read cache method: {backend.read_cache_method})")
    if trace.enabled() and not trace.keeps_arguments():
        out.append("[WARNING] DFTRACER_ENABLE=1 without DFTRACER_INC_METADATA=1: dftracer drops every event's "
                   "arguments, so the trace has times but no bytes, files, steps or ranks; set both")
    if session.starved_steps:
        out.append(generation_limited_warning(session.starved_steps, session.topology))
    if c.num_checkpoints_write and backend.chunk_warning(session.config.chunk_size):
        out.append(backend.chunk_warning(session.config.chunk_size))
    for phase, cpu in session.client_cpu.items():
        out += phases.client_cpu_warning(phase, cpu)
    out += phases.stall_warnings(session.stalls)
    if session.tiers_summary is not None:
        out += tiers.overrun_warnings(session.tiers_summary)
    for phase in PHASES:
        out += phases.throttle_warnings(phase, session.windows[phase])
    if c.recovery_rank_shift and session.checkpointer.source_rank() == session.rank:
        out.append("[WARNING] checkpoint.recovery_rank_shift=True shifts nothing here: all "
                   f"{session.size} ranks are on one node (the shift is by ranks per node), so every rank "
                   "reads its own files")
    return out
