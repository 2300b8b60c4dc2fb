"""Our result files, beside DLIO's in the run directory.

DLIO owns summary.json (its schema: see dlio_schema.py); our richer record of
a run is RECORD_FILE, with the manifest, the effective config and one
rank_stats file per rank.
"""
from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import sys
from dataclasses import asdict
from typing import Optional, Protocol

from omegaconf import DictConfig, OmegaConf

from dlio_ckpt_ext.dlio import provenance, trace
from dlio_ckpt_ext.engine.profile import GiB
from dlio_ckpt_ext.results import goodput
from dlio_ckpt_ext.results.windows import mean_std
from dlio_ckpt_ext.engine.buffers import huge_page_bytes, thp_setting
from dlio_ckpt_ext.engine.threads import usable_cpus
from dlio_ckpt_ext.redact import redact_args, redact_tree
from dlio_ckpt_ext.result_files import (CHUNKS_FILE, CONFIG_FILE, MANIFEST_FILE, RANK_STATS_DIR, RECORD_FILE,
                                        RUNNING_FILE, WINDOWS_FILE, write_json)

from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import RunConfig
from dlio_ckpt_ext.dlio.mpi import Topology


class CheckpointSession(Protocol):
    """What the writers here read of a run (dlio/session.py's CheckpointSession,
    which imports this module: named by its shape, not imported back)."""
    config: RunConfig
    workload: DictConfig
    checkpointer: Checkpointer
    topology: Topology
    output_folder: str
    rank: int
    size: int
    start_time: float
    end_time: float
    #: phase -> this rank's per-checkpoint records; windows: rank 0's global windows
    local: dict[str, list[dict]]
    windows: dict[str, list[dict]]
    blocked: list[dict]
    inventory: Optional[dict]
    async_summary: Optional[dict]
    rank_buffer_bytes: int
    #: tiers: rank 0's local-save windows and TIERS figures (None without tiers)
    tier_windows: list[dict]
    tiers_summary: Optional[dict]
    #: a training run: rank 0's TRAINING figures (None in a checkpoint-only run)
    training_summary: Optional[dict]

    def tier_settings(self) -> dict: ...

    @property
    def checkpoint_bytes(self) -> int: ...

    def warnings(self) -> list[str]: ...



def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory (VmHWM; ru_maxrss would carry over
    from the process that exec'd us)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def write_running(session: CheckpointSession) -> None:
    """Rank 0, before the first checkpoint's window: the marker of a run in
    progress (see RUNNING_FILE), with every checkpoint this run will write."""
    c, topo = session.config.checkpoint, session.topology
    os.makedirs(session.output_folder, exist_ok=True)
    write_json(os.path.join(session.output_folder, RUNNING_FILE), {
        "status": "running", "start_time": session.start_time, "start_time_utc": _utc(session.start_time),
        "command": redact_args(sys.argv), "ranks": session.size, "hosts": list(topo.hosts),
        "checkpoints": redact_tree(session.checkpointer.planned_writes(session.config.checkpoints_saved())),
        "keep_files": c.keep_files})


def append_window(session: CheckpointSession, phase: str, window: dict) -> None:
    """Rank 0: one checkpoint's global window, appended as it ends (WINDOWS_FILE)."""
    with open(os.path.join(session.output_folder, WINDOWS_FILE), "a") as fh:
        fh.write(json.dumps({"phase": phase, **window}, default=str) + "\n")


def remove_running(session: CheckpointSession) -> None:
    """Rank 0, after the record of the finished run is written."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(session.output_folder, RUNNING_FILE))


def _percentiles(values: list[float]) -> dict:
    v = sorted(values)
    at = lambda q: v[round(q * (len(v) - 1))]  # noqa: E731 - nearest rank
    return {"min": v[0], "p10": at(0.1), "p50": at(0.5), "p90": at(0.9), "max": v[-1]}


def file_summary(stats: dict) -> dict:
    """A file's record without its chunk list: how many chunks, and their I/O
    rates' percentiles (a chunk is [offset, nbytes, fill_s, io_s, ...])."""
    chunks = stats.get("chunks") or []
    rates = [c[1] / GiB / c[3] for c in chunks if c[3] > 0]
    out = {k: v for k, v in stats.items() if k != "chunks"}
    out["chunk_count"] = len(chunks)
    if rates:
        out["chunk_io_gib_s"] = _percentiles(rates)
    return out


def write_rank_stats(session: CheckpointSession, totals: dict) -> None:
    ck, topo = session.checkpointer, session.topology
    rank_dir = os.path.join(session.output_folder, RANK_STATS_DIR)
    os.makedirs(rank_dir, exist_ok=True)
    phases = {p: [{**rec, "files": [file_summary(f) for f in rec["files"]]} for rec in recs]
              for p, recs in session.local.items()}
    if session.config.streaming.record_chunks:
        with gzip.open(os.path.join(rank_dir, CHUNKS_FILE.format(rank=session.rank)), "wt") as fh:
            json.dump({"rank": session.rank, "phases": {p: [[f["chunks"] for f in rec["files"]] for rec in recs]
                                                        for p, recs in session.local.items()}}, fh)
    write_json(os.path.join(rank_dir, f"rank_{session.rank:05d}.json"), {
        # pid: DLIO 2.0.0 traces a rank as process id = rank; `dlio-ckpt-report traces` puts this back
        "rank": session.rank, "hostname": os.uname().nodename, "pid": os.getpid(), "local_rank": topo.local_rank,
        "ranks_per_node": topo.ranks_per_node, "gen_threads": ck.gen_threads,
        "cpu_mask_size": topo.cpu_mask_size, "cpu_share": topo.cpu_share,
        "gen_thread_budget": {**ck.threads.describe(), "starved": ck.threads.starved},
        "source_rank_for_loads": ck.source_rank(), "phases": phases, "totals": totals, "async_blocked": session.blocked,
        "stalls": session.stall_watch.stalls,
        # the whole run's, listings and markers included (each checkpoint's own are in its record)
        "retries_total": ck.backend.retry_counts(),
        # a client library's requests by kind, where it is not s3dlio (storage/libraries/requests.py)
        "requests_total": ck.backend.request_counts(),
        "peak_rss_bytes": peak_rss_bytes(), "buffer_bytes": session.rank_buffer_bytes,
        "buffer_huge_page_bytes": huge_page_bytes(),
        "staging_bytes": ck.staging.nbytes if ck.staging is not None else 0,
        "trace": dict(trace.COST) if trace.enabled() else None})


def manifest(session: CheckpointSession) -> dict:
    """What makes two results comparable: code, environment and settings."""
    ck, topo = session.checkpointer, session.topology
    return {"versions": provenance.versions(), "dlio": provenance.dlio_flavor(),
            "git_commit": provenance.git_commit(),
            "command": redact_args(sys.argv), "model": session.config.model.name,
            "start_time": session.start_time, "end_time": session.end_time,
            "start_time_utc": _utc(session.start_time), "end_time_utc": _utc(session.end_time),
            "ranks": session.size, "hosts": list(topo.hosts), "num_hosts": topo.num_hosts,
            "ranks_per_node": topo.ranks_per_node,
            "threads": {"gen_threads_per_rank": ck.gen_threads, "usable_cpus": usable_cpus(),
                        "gen_thread_mode": ck.threads.describe()["mode"], "gen_thread_limit": ck.threads.limit,
                        # rank 0's; every rank's mask size and share are in its rank stats
                        "cpu_share": topo.cpu_share, "binding": topo.binding},
            "binding": topo.binding,
            "storage": ck.backend.describe(), "concurrency": ck.concurrency(),
            "cache_method": ck.backend.read_cache_method,
            "reads_may_be_cached": ck.backend.reads_may_be_cached,
            # huge pages make O_DIRECT requests larger (engine/buffers.allocate)
            "transparent_hugepage": thp_setting()}


def effective_config(session: CheckpointSession) -> tuple[dict, dict]:
    """Our validated sections and DLIO's whole workload, credentials redacted."""
    sections = redact_tree(asdict(session.config.sections))
    workload = redact_tree(OmegaConf.to_container(session.workload, resolve=True))
    return sections, workload


def phase_summary(windows: list[dict], report: dict) -> dict:
    d_mean, d_std = mean_std([x["duration_s"] for x in windows])
    t_mean, t_std = mean_std([x["throughput_gib_s"] for x in windows])
    return {"checkpoints": len(windows), "duration_s_mean": d_mean, "duration_s_std": d_std,
            "throughput_gib_s_mean": t_mean, "throughput_gib_s_std": t_std,
            "per_checkpoint": windows, "results": report}


def write_run_record(session: CheckpointSession, reports: dict) -> list[str]:
    """Rank 0: the manifest, the effective config and RECORD_FILE; returns the GOODPUT
    block, which reads the record's figures (docs/goodput.md)."""
    folder = session.output_folder
    size = session.checkpoint_bytes
    man = manifest(session)
    sections, workload = effective_config(session)
    write_json(os.path.join(folder, MANIFEST_FILE), man)
    with open(os.path.join(folder, CONFIG_FILE), "w") as fh:
        fh.write(OmegaConf.to_yaml({"workload": workload}))
    record = {"status": "success", "benchmark": "dlio-ckpt-ext streaming checkpoint",
              "checkpoint_bytes": size, "checkpoint_gib": size / GiB,
              **man, "inventory": session.inventory, "warnings": session.warnings(), "stalls": session.stalls,
              "config": {"effective": sections, "workload": workload}}
    for phase in ("save", "load"):
        record[phase] = phase_summary(session.windows[phase], reports[phase])
    record["async_mode"] = session.config.checkpoint.async_mode
    record["layout"] = session.config.checkpoint.layout
    record["restore"] = session.restore
    if session.async_summary is not None:
        record["async"] = {**session.async_summary, "persist_is": "the save figures: each checkpoint's window "
                           "from the first rank's persist start to the commit",
                           "interval_s": session.config.checkpoint.time_between_checkpoints}
    if session.tiers_summary is not None:
        record["tiers"] = {**session.tiers_summary, "settings": session.tier_settings(),
                           "local_windows": session.tier_windows,
                           "persistent_are": "the save figures (save.per_checkpoint): each persistent save's window"}
    if session.training_summary is not None:
        record["training"] = session.training_summary
    if session.recovery_summary:
        record["recovery"] = session.recovery_summary
    if session.conversions:
        record["conversions"] = session.conversions
    record["goodput"] = goodput.summarise(record, session.config.sections.goodput)
    write_json(os.path.join(folder, RECORD_FILE), record)
    return goodput.goodput_lines(record["goodput"])
