"""DLIO's training loop as seen from our checkpoints.

A training workflow's saves come from DLIO's own loop (every
steps_between_checkpoints steps, or at epoch ends), so a run learns its
checkpoints as they are asked for. This module times that loop at DLIO's own
measuring points (StatsCounter.batch_loaded and batch_processed, on DLIO
2.0.0, upstream main and MLCommons' fork alike), names each save as its
framework would, and keeps O(1) per step: each rank's figures are summed as
the loop runs, never gathered step by step.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from dlio_ckpt_ext.config import CheckpointId
from dlio_ckpt_ext.layouts.base import Layout


@dataclass
class LoadTotals:
    """The data loader's batches of one kind: how many, their bytes and the loop's wait for them."""
    batches: int = 0
    nbytes: int = 0
    seconds: float = 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        self.batches += 1
        self.nbytes += nbytes
        self.seconds += seconds


@dataclass
class TrainingLoop:
    """This rank's view of DLIO's training loop."""
    #: steps processed (the training iteration a framework names its checkpoints by)
    steps: int = 0
    compute_s: float = 0.0
    #: the first step's load start; the last step's end
    first_start: Optional[float] = None
    last_end: float = 0.0
    #: the running step: its load start and its compute
    step_start: float = 0.0
    step_compute_s: float = 0.0
    #: batches waited for while this rank's checkpoint I/O ran, and while it did not
    #: (classified when the batch arrives, against the I/O windows known then)
    loads: dict[str, LoadTotals] = field(default_factory=lambda: {"during_save": LoadTotals(),
                                                                   "no_save": LoadTotals()})
    #: steps without a save after them: their count and seconds (load start to end)
    plain_steps: int = 0
    plain_step_s: float = 0.0
    #: DLIO's StatsCounter (its AU and throughput, computed at the end of its run)
    stats: Any = None
    #: the epoch of the last batch: an epoch's first batch waits for its pipeline to fill
    #: and is left out of the loader figures, as DLIO leaves a block's first step out of its AU
    epoch: Any = None

    def loaded(self, epoch: Any, start: float, end: float, nbytes: int, busy: "IoWindows") -> None:
        if self.first_start is None:
            self.first_start = start
        self.step_start = start
        if epoch != self.epoch:
            self.epoch = epoch
            return
        kind = "during_save" if busy.overlaps(start, end) else "no_save"
        self.loads[kind].add(nbytes, end - start)

    def processed(self, end: float, compute_s: float) -> None:
        self.steps += 1
        self.compute_s += compute_s
        self.step_compute_s = compute_s
        self.last_end = end
        self.plain_steps += 1
        self.plain_step_s += end - self.step_start

    def saved(self, end: float) -> dict:
        """A save just returned after the current step: that step is no plain
        one; returns the saving step's own figures."""
        if self.plain_steps and self.last_end >= self.step_start:
            self.plain_steps -= 1
            self.plain_step_s -= self.last_end - self.step_start
        self.last_end = max(self.last_end, end)
        return {"step_s": end - self.step_start, "compute_s": self.step_compute_s}


class IoWindows:
    """This rank's checkpoint I/O windows (saves, persists, local saves) as they
    end; a window still open (a persist in the background) counts from its
    start. Windows end in order, so only the last few can reach a batch that
    ends now: a few are kept, whatever the run's length."""

    def __init__(self) -> None:
        self.closed: deque[tuple[float, float]] = deque(maxlen=4)
        self.open_since: Optional[float] = None

    def overlaps(self, start: float, end: float) -> bool:
        if self.open_since is not None and self.open_since < end:
            return True
        return any(s < end and start < e for s, e in self.closed)


#: this process's loop (one DLIO run a process; a multirun job starts it anew)
_loop = TrainingLoop()
_busy = IoWindows()
_installed = False


def loop() -> TrainingLoop:
    return _loop


def io_windows() -> IoWindows:
    return _busy


def reset() -> None:
    global _loop, _busy
    _loop, _busy = TrainingLoop(), IoWindows()


def batch_bytes() -> int:
    """A training batch's bytes as DLIO sizes its samples (batch_size x record_length)."""
    from dlio_benchmark.utils.config import ConfigArguments
    args = ConfigArguments.get_instance()
    return int(getattr(args, "batch_size", 0) or 0) * int(getattr(args, "record_length", 0) or 0)


def install() -> None:
    """Time DLIO's loop at its StatsCounter's own calls. DLIO 2.0.0 passes the
    step's start (t0) and its computation time; upstream main and the fork keep
    them on the counter (start_time_loading, computation_time)."""
    global _installed
    if _installed:
        return
    from dlio_benchmark.utils.statscounter import StatsCounter
    dlio_loaded, dlio_processed = StatsCounter.batch_loaded, StatsCounter.batch_processed
    nbytes = batch_bytes

    def batch_loaded(self, epoch, step, block, *rest):
        end = time.time()
        start = rest[0] if rest else getattr(self, "start_time_loading", end)
        _loop.stats = self
        _loop.loaded(epoch, start, end, nbytes(), _busy)
        return dlio_loaded(self, epoch, step, block, *rest)

    def batch_processed(self, epoch, step, block, *rest):
        out = dlio_processed(self, epoch, step, block, *rest)
        compute = rest[1] if len(rest) > 1 else getattr(self, "computation_time", 0.0)
        _loop.processed(time.time(), float(compute or 0.0))
        return out

    StatsCounter.batch_loaded, StatsCounter.batch_processed = batch_loaded, batch_processed
    _installed = True


def checkpoint_id(layout: Layout, epoch: int, step: int, iteration: int) -> CheckpointId:
    """The name a training loop's save gets: DLIO's (epoch, step) where the
    layout's names carry the epoch (DeepSpeed's global_epoch{e}_step{s}, DLIO's
    own); else the training iteration, as Megatron, torchtitan and Orbax number
    their checkpoints (DLIO's step restarts every epoch, so two epochs' saves
    would share a name). iteration: the steps processed so far (DLIO's step
    where the loop was not timed)."""
    if layout.names_epoch:
        return step, epoch
    return (iteration or step), 1


def dlio_figures(stats: Any) -> dict:
    """DLIO's own accelerator utilization and throughput of the run, as its
    StatsCounter computed them at the end of its run (rank 0's); {} before that."""
    metric = (getattr(stats, "summary", None) or {}).get("metric") or {}
    keys = {"au_mean_pct": "train_au_mean_percentage",
            "throughput_mean_samples_s": "train_throughput_mean_samples_per_second"}
    return {ours: float(metric[theirs]) for ours, theirs in keys.items() if theirs in metric}
