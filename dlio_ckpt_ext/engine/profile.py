"""Per-file and per-phase timing records of the streaming engine."""
from __future__ import annotations

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
