"""Checkpoint spans in DLIO's dftracer trace.

DLIO starts the tracer (DFTRACER_ENABLE=1, per rank, in its output folder);
we add our events to the same trace through the tracer DLIO imported, so
they sit beside DLIO's own. A span per checkpoint is logged live (one event);
per-file and per-chunk spans (fill, I/O, close) are logged in finalize from
the engine's records, with their measured wall-clock times converted to the
tracer's clock, so nothing is added inside a timed window per chunk. dftracer
does not intercept preadv, so without these spans a trace shows no reads.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Optional

CAT = "dlio_ckpt_ext"

#: what tracing cost this process: seconds spent logging inside timed
#: windows (checkpoint spans) and after them (file and chunk spans), events
COST = {"in_window_s": 0.0, "after_s": 0.0, "events": 0}


def _tracer():
    """DLIO's tracer instance when a trace is being written, else None.

    dftracer's switch is its environment variable: pydftracer 1.x's Python
    side defaults to on while its native side stays off (and answers
    get_time() with -1), so the variable decides, as it does for dftracer."""
    if os.environ.get("DFTRACER_ENABLE") != "1":
        return None
    try:
        from dlio_benchmark.utils.utility import PerfTrace
        inst = PerfTrace.get_instance() if hasattr(PerfTrace, "get_instance") else PerfTrace
    except Exception:  # noqa: BLE001 - no dftracer: nothing to trace
        return None
    return inst if getattr(inst, "logger", None) else None


def _units_per_second() -> float:
    try:
        from dftracer.python import get_time_scale
        return float(get_time_scale())
    except Exception:  # noqa: BLE001 - pydftracer 1.x: microseconds
        return 1e6


def _log(tracer, name: str, start: int, duration: int) -> None:
    # dftracer keeps a stack of open events: a bare log_event corrupts it
    tracer.enter_event()
    tracer.log_event(name, CAT, start, duration)
    tracer.exit_event()


class _Clock:
    """Maps time.time() seconds to the tracer's clock."""

    def __init__(self, tracer) -> None:
        self.scale = _units_per_second()
        self.offset = tracer.get_time() - time.time() * self.scale

    def at(self, wall: float) -> int:
        return int(wall * self.scale + self.offset)

    def length(self, seconds: float) -> int:
        return max(0, int(seconds * self.scale))


@contextlib.contextmanager
def span(name: str, step: Optional[int] = None):
    """One live event around a block (a whole checkpoint save or load)."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    clock = _Clock(tracer)
    start = time.time()
    try:
        yield
    finally:
        end = time.time()
        _log(tracer, f"{name}.step{step}" if step is not None else name, clock.at(start),
             clock.length(end - start))
        COST["in_window_s"] += time.time() - end
        COST["events"] += 1


def chunk_events(files_by_phase: dict) -> int:
    """Log each file's span and its per-chunk stages; returns the events logged."""
    tracer = _tracer()
    if tracer is None:
        return 0
    began = time.perf_counter()
    clock = _Clock(tracer)
    count = 0

    def event(name: str, end: float, seconds: float) -> None:
        nonlocal count
        _log(tracer, name, clock.at(end - seconds), clock.length(seconds))
        count += 1

    for phase, files in files_by_phase.items():
        io_name = "write" if phase == "save" else "read"
        gen_name = "fill" if phase == "save" else "verify"
        for f in files:
            event(f"file.{io_name}", f.end, f.end - f.start)
            if f.close_s:
                event("file.close", f.end, f.close_s)
            for _, _, fill_s, io_s, _, _, done_at, produced_at in f.chunks:
                # save: fill is produced, the write consumes; load: the read is
                # produced, verification consumes.
                first, second = (fill_s, io_s) if phase == "save" else (io_s, fill_s)
                first_name, second_name = ((f"chunk.{gen_name}", f"chunk.{io_name}") if phase == "save"
                                           else (f"chunk.{io_name}", f"chunk.{gen_name}"))
                event(first_name, produced_at, first)
                if second:
                    event(second_name, done_at, second)
    COST["after_s"] += time.perf_counter() - began
    COST["events"] += count
    return count


def enabled() -> bool:
    return _tracer() is not None
