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
    # per chunk: [offset, nbytes, fill_s, io_s, wait_free_s, wait_filled_s]
    chunks: list[list[float]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_phase(files: list[FileStats], wall_s: float) -> dict:
    """Roll a phase's files up: generation vs I/O capacity and the bottleneck.

    wall_s is the phase's wall time for these files (the sum of per-file
    elapsed times when files are processed one after another).
    """
    nbytes = sum(f.nbytes for f in files)
    fill = sum(f.fill_s for f in files)
    io = sum(f.io_s + f.close_s for f in files)
    fill_bound = sum(f.chunks_fill_bound for f in files)
    io_bound = sum(f.chunks_io_bound for f in files)
    gen_rate = nbytes / GiB / fill if fill > 0 else None
    io_rate = nbytes / GiB / io if io > 0 else None
    return {
        "bytes": nbytes,
        "fill_s": fill,
        "io_s": io,
        "wall_s": wall_s,
        "generation_gib_s": gen_rate,
        "io_gib_s": io_rate,
        "generation_to_io_ratio": (gen_rate / io_rate) if gen_rate and io_rate else None,
        "pipeline_overhead_pct": (100.0 * (wall_s - max(fill, io)) / wall_s) if wall_s > 0 else 0.0,
        "chunks_fill_bound": fill_bound,
        "chunks_io_bound": io_bound,
        "bottleneck": "Generation" if fill > io else "I/O",
    }
