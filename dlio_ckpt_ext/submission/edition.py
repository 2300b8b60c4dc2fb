"""The checkpointing rules of MLPerf Storage rules edition 3.0 (mlcommons/storage
Rules.md, rules_edition "3.0"), as numbers and as checks that name the rule.

Each check returns the violations as one line each, starting with the rule's
number, so the CLI can print them before anything runs and the same text lands
in results.json.
"""
from __future__ import annotations

import datetime
from typing import Optional

RULES_EDITION = "3.0"
#: results-dir / leaf format: 3 = code-image pool, pointers, provenance and manifest;
#: 2 = the layout of mlpstorage <= 3.0.26 (its checker knows nothing of the pool)
LAYOUT_VERSIONS = (3, 2)
DEFAULT_LAYOUT = 3

#: Table 2: CLOSED total processes (TP x PP x DP) per model
CLOSED_PROCESSES = {"llama3_8b": 8, "llama3_70b": 64, "llama3_405b": 512, "llama3_1t": 1024}
#: 4.3.5: the one subset form that exists
SUBSET_MODEL, SUBSET_PROCESSES = "llama3_8b", 8
#: Table 4: --num-checkpoints-write/read in CLOSED (0 only as the other phase of the split)
CLOSED_CHECKPOINTS = 10
#: 4.6.2: CLOSED needs more than this many simulated accelerators per host
CLOSED_MIN_EXCLUSIVE_PER_HOST = 4

#: Table 3: simulated accelerator memory (GB as the rules write it; compared with
#: summary.json's checkpoint_size_GB, which DLIO computes in GiB)
ACCELERATOR_MEMORY_GB = {"b200": 180, "mi355": 288, "h100": 80, "a100": 80}
#: accepted only in the whatif division, which this tool does not write
WHATIF_ONLY = ("h100", "a100")

#: 4.7.1: the read invocation must start within this many seconds of the write's end
FAILOVER_GAP_LIMIT_S = 30.0


def accelerator_violations(accelerator: Optional[str], processes: int, checkpoint_gib: float) -> list[str]:
    """4.3.4: a recorded Table 3 accelerator whose memory, times the processes
    (one simulated accelerator each), holds one whole checkpoint."""
    usable = ", ".join(f"{a} ({ACCELERATOR_MEMORY_GB[a]} GB)" for a in ACCELERATOR_MEMORY_GB if a not in WHATIF_ONLY)
    if not accelerator:
        return [f"4.3.4 no accelerator type recorded: pass --accelerator-type, one of {usable}"]
    if accelerator not in ACCELERATOR_MEMORY_GB or accelerator in WHATIF_ONLY:
        return [f"4.3.4 accelerator {accelerator} is not in Table 3 for CLOSED or OPEN (edition {RULES_EDITION}): "
                f"one of {usable}"]
    memory = processes * ACCELERATOR_MEMORY_GB[accelerator]
    if memory < checkpoint_gib:
        return [f"4.3.4 {processes} x {accelerator} ({ACCELERATOR_MEMORY_GB[accelerator]} GB each) hold {memory} GB, "
                f"less than the checkpoint's {checkpoint_gib:.2f} GB"]
    return []


def closed_shape_violations(model: str, processes: int, subset: bool, per_host: list[int]) -> list[str]:
    """4.6.1 process counts, 4.3.5 subset mode and 4.6.2 processes per host for a CLOSED run."""
    required = CLOSED_PROCESSES.get(model)
    if required is None:
        return [f"4.3.3 model {model!r} is not a CLOSED model ({', '.join(CLOSED_PROCESSES)})"]
    out = []
    if subset and (model, processes) != (SUBSET_MODEL, SUBSET_PROCESSES):
        out.append(f"4.3.5 subset mode exists only for {SUBSET_MODEL} on {SUBSET_PROCESSES} processes; this is "
                   f"{model} on {processes}")
    if processes != required:
        out.append(f"4.6.1 {processes} processes; CLOSED {model} requires {required} (Table 2)")
    crowded = sorted(set(n for n in per_host if n <= CLOSED_MIN_EXCLUSIVE_PER_HOST))
    if crowded:
        out.append(f"4.6.2 {' or '.join(map(str, crowded))} processes on a host; CLOSED requires more than "
                   f"{CLOSED_MIN_EXCLUSIVE_PER_HOST} per host")
    return out


def closed_checkpoint_violations(num_write: int, num_read: int, fsync: bool) -> list[str]:
    """Table 4 checkpoint counts (this tool always runs the write/read split) and 4.3.2 fsync."""
    out = [f"4.7.1 checkpoint.{key} is {value}; CLOSED requires {CLOSED_CHECKPOINTS} (run as the write/read split)"
           for key, value in (("num_checkpoints_write", num_write), ("num_checkpoints_read", num_read))
           if value != CLOSED_CHECKPOINTS]
    if not fsync:
        out.append("4.3.2 checkpoint.fsync is off; it must be on")
    return out


def _time(value) -> Optional[datetime.datetime]:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    # DLIO and this tool write local time without an offset; compare like with like
    return t.astimezone().replace(tzinfo=None) if t.tzinfo else t


def failover_gap(write_meta: dict, write_summary: dict, read_meta: dict, read_summary: dict
                 ) -> tuple[Optional[float], str]:
    """4.7.1's failover gap as the rules define it: the read invocation's
    invocation_start_time minus the write invocation's invocation_end_time,
    falling back to summary.json's end_time (or end) on the write side and its
    start_time (or start) on the read side, for folders written before the
    metadata carried the times. (The rules' other write-side fallback, the
    latest collection_timestamp, comes from mlpstorage's cluster collection,
    which this tool does not run.) Returns the gap in seconds (None if a side
    has no time) and which fields gave it."""
    write_end = [("invocation_end_time", _time(write_meta.get("invocation_end_time")))]
    write_end += [(f"summary {k}", _time(write_summary.get(k))) for k in ("end_time", "end")]
    read_start = [("invocation_start_time", _time(read_meta.get("invocation_start_time")))]
    read_start += [(f"summary {k}", _time(read_summary.get(k))) for k in ("start_time", "start")]
    w = next(((name, t) for name, t in write_end if t), None)
    r = next(((name, t) for name, t in read_start if t), None)
    if not (w and r):
        return None, "no time recorded"
    return (r[1] - w[1]).total_seconds(), f"read {r[0]} - write {w[0]}"


def failover_violations(gap: Optional[float], source: str) -> list[str]:
    if gap is None:
        return [f"4.7.1 the failover gap cannot be computed: {source}"]
    if gap > FAILOVER_GAP_LIMIT_S:
        return [f"4.7.1 checkpointCacheFlushValidation: the read invocation started {gap:.1f} s after the write "
                f"invocation ended ({source}); at most {FAILOVER_GAP_LIMIT_S:.0f} s"]
    return []
