"""Per-file and per-phase timing records of the streaming engine."""
from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field

GiB = float(1 << 30)


@dataclass
class FileStats:
    """What one file cost. fill_s is pure generation time (content fill for a
    save, regeneration for a verified load); io_s is pure storage time
    (write or read calls); close_s is close + fsync or upload completion."""
    name: str
    nbytes: int
    start: float = 0.0   # wall clock, seconds since the epoch
    end: float = 0.0
    fill_s: float = 0.0
    io_s: float = 0.0
    close_s: float = 0.0
    open_s: float = 0.0  # opening it (S3: CreateMultipartUpload); part of io_s
    wait_free_s: float = 0.0
    wait_filled_s: float = 0.0
    chunks_fill_bound: int = 0
    chunks_io_bound: int = 0
    gen_threads: int = 0  # generator threads this file had
    # per chunk: [offset, nbytes, fill_s, io_s, wait_free_s, wait_filled_s, done_at, produced_at]
    chunks: list[list[float]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


def process_usage() -> tuple[float, float, int]:
    """This process's user and system CPU seconds and minor page faults so far:
    every thread's (the generators', the storage client's runtime, DLIO's)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def usage_since(before: tuple[float, float, int]) -> dict:
    """The CPU seconds and minor faults since process_usage() gave `before`."""
    user, sys_, faults = process_usage()
    return {"cpu_user_s": user - before[0], "cpu_sys_s": sys_ - before[1], "minor_faults": faults - before[2]}


#: a request this many times the rank's median request time, and at least
#: SLOW_FLOOR_S, counts as slow: what a retried request (a dropped connection,
#: throttling, a stalled server) costs, which the storage client does not report
SLOW_MULTIPLE, SLOW_FLOOR_S = 10.0, 1.0


def slow_requests(files: list[FileStats], closes: bool = False) -> dict:
    """One rank's requests of a phase (a chunk's storage time: a write, a ranged
    read, an upload part handed over; with closes, each file's close too, where
    it waits for uploads in flight; each file's open), and those slower than SLOW_MULTIPLE x their
    median and SLOW_FLOOR_S, with the slowest (seconds, file)."""
    times = sorted([(c[3], f.name) for f in files for c in f.chunks] + [(f.open_s, f.name) for f in files]
                   + ([(f.close_s, f.name) for f in files] if closes else []))
    if not times:
        return {"requests": 0, "slow": 0, "median_s": 0.0, "worst_s": 0.0, "worst_file": ""}
    median = times[len(times) // 2][0]
    limit = max(SLOW_MULTIPLE * median, SLOW_FLOOR_S)
    worst = times[-1]
    return {"requests": len(times), "slow": sum(1 for s, _ in times if s > limit), "median_s": median,
            "worst_s": worst[0], "worst_file": worst[1]}


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Wall time covered by at least one of the (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def phase_totals(files: list[FileStats]) -> dict:
    """Sums one rank contributes to the generation-vs-I/O report of a phase."""
    return {"bytes": sum(f.nbytes for f in files), "fill_s": sum(f.fill_s for f in files),
            "io_s": sum(f.io_s + f.close_s for f in files), "close_s": sum(f.close_s for f in files),
            # files whose lifetimes overlap (S3: closed after the next was sent) count once
            "wall_s": busy_seconds([(f.start, f.end) for f in files]),
            "chunks_fill_bound": sum(f.chunks_fill_bound for f in files),
            "chunks_io_bound": sum(f.chunks_io_bound for f in files),
            "wait_free_s": sum(f.wait_free_s for f in files),
            "wait_filled_s": sum(f.wait_filled_s for f in files)}


def phase_report(per_rank: list[dict]) -> dict:
    """Rates per rank: generation capacity, I/O, their ratio and the bottleneck."""
    t = {k: sum(r[k] for r in per_rank) for k in per_rank[0]} if per_rank else {}
    if not t or t["bytes"] == 0:
        return {}
    gen = t["bytes"] / GiB / t["fill_s"] if t["fill_s"] > 0 else None
    io = t["bytes"] / GiB / t["io_s"] if t["io_s"] > 0 else None
    slower = max(t["fill_s"], t["io_s"])
    return {**t,
            "generation_gib_s_per_rank": gen, "io_gib_s_per_rank": io,
            "generation_to_io_ratio": gen / io if gen and io else None,
            "pipeline_overhead_pct": 100.0 * (t["wall_s"] - slower) / t["wall_s"] if t["wall_s"] > 0 else 0.0,
            "bottleneck": "Generation" if t["fill_s"] > t["io_s"] else "I/O"}
