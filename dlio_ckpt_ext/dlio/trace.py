"""Checkpoint spans in DLIO's dftracer trace, in the vocabulary of dftracer's
analysers.

DLIO starts the tracer (DFTRACER_ENABLE=1, per rank, in its output folder);
we add our events to the same trace through the tracer DLIO imported, so
they sit beside DLIO's own. Every span is logged live, in the thread that did
the work (the tracer stamps the calling thread: fills land on generator
threads, reads on their reader lanes), with its arguments:

* ``checkpoint`` (DLIO's category for checkpoint work, the layer
  ``dfanalyzer``'s dlio presets select): ``checkpoint.save`` and
  ``checkpoint.load``, one per rank per checkpoint (``checkpoint.persist``
  too in async mode); args rank, step, size (the rank's bytes), files.
* ``checkpoint_file``: ``checkpoint.file.write`` / ``.read`` / ``.close``;
  args rank, step, fname, size. A category of its own because the analyser
  sums a layer's event durations: nested in ``checkpoint`` they would count
  the same seconds twice.
* ``checkpoint_io``: one ``write`` or ``read`` per request, named as the I/O
  call so dftracer-utils sizes it from ``ret`` (the bytes moved), as it does
  an intercepted POSIX call, yet apart from the POSIX category (dftracer does
  not intercept preadv, and S3 requests are no POSIX calls at all); args
  rank, step, fname, ret, offset, index.
* ``checkpoint_gen``: ``fill`` and ``verify`` (content generation, not I/O);
  args rank, step, fname, size, offset, index.

The step is an argument, never part of a name, so statistics grouped by name
give one row per operation.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Optional

from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.engine.spans import SpanSink

CHECKPOINT, FILE, IO, GEN = "checkpoint", "checkpoint_file", "checkpoint_io", "checkpoint_gen"
#: DLIO's category of its benchmark's own steps (initialize, _checkpoint_write, ...)
APP = "dlio_benchmark"
#: a chunk stage's category and event name
_STAGES = {"write": (IO, "write"), "read": (IO, "read"), "fill": (GEN, "fill"), "verify": (GEN, "verify")}

#: what tracing cost this process: seconds spent logging our spans (all of
#: them inside the timed windows, since they are logged live) and events
COST = {"in_window_s": 0.0, "events": 0}
_cost_lock = threading.Lock()


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


def _pydftracer_2() -> bool:
    try:
        import dftracer.python  # noqa: F401 - pydftracer 2.x's package
        return True
    except Exception:  # noqa: BLE001 - pydftracer 1.x (DLIO 2.0.0)
        return False


def _units_per_second() -> float:
    try:
        from dftracer.python import get_time_scale
        return float(get_time_scale())
    except Exception:  # noqa: BLE001 - pydftracer 1.x: microseconds
        return 1e6


class _Emitter:
    """Logs one complete event with arguments on either pydftracer, straight
    through its native logger: pydftracer 2's Python wrapper formats a debug
    message on every call: 16.5 us an event against our 9.3 (bench/trace_bench.py --per-event)."""

    def __init__(self, tracer) -> None:
        self.native = tracer.logger
        self.enter, self.exit = self.native.enter_event, self.native.exit_event
        self.v2 = _pydftracer_2()
        self.scale = _units_per_second()
        self.offset = tracer.get_time() - time.time() * self.scale

    def emit(self, name: str, cat: str, start: float, end: float, ints: dict, strings: dict) -> None:
        began = time.perf_counter()
        if self.v2:  # (tag type KEY, value), as pydftracer 2's own decorators pass them
            ints = {k: (0, v) for k, v in ints.items()}
            strings = {k: (0, v) for k, v in strings.items()}
        # dftracer keeps a stack of open events: a bare log_event corrupts it
        self.enter()
        self.native.log_event(name=name, cat=cat, start_time=int(start * self.scale + self.offset),
                              duration=max(0, int((end - start) * self.scale)), int_args=ints, float_args={},
                              string_args=strings)
        self.exit()
        spent = time.perf_counter() - began
        with _cost_lock:
            COST["in_window_s"] += spent
            COST["events"] += 1


def enabled() -> bool:
    return _tracer() is not None


def keeps_arguments() -> bool:
    """dftracer writes event arguments only with this switch (both pydftracers)."""
    return os.environ.get("DFTRACER_INC_METADATA") == "1"


@contextlib.contextmanager
def span(name: str, cat: str = CHECKPOINT, **args: int):
    """One live event around a block; args are the event's (integer) arguments."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    emitter = _Emitter(tracer)
    start = time.time()
    try:
        yield
    finally:
        emitter.emit(name, cat, start, time.time(), args, {})


class ChunkTracer:
    """The checkpointer's tracer (engine.spans.Tracer): file and chunk spans
    of one rank, logged as they finish."""

    def __init__(self, rank: int) -> None:
        tracer = _tracer()
        if tracer is None:
            raise RuntimeError("no dftracer trace is being written")
        self.emitter, self.rank = _Emitter(tracer), rank

    def chunk_sink(self, step: int) -> SpanSink:
        emit, rank = self.emitter.emit, self.rank

        def sink(stage: str, path: str, index: int, offset: int, nbytes: int, start: float, end: float) -> None:
            cat, name = _STAGES[stage]
            emit(name, cat, start, end, {"rank": rank, "step": step, "ret" if cat == IO else "size": nbytes,
                                         "offset": offset, "index": index}, {"fname": path})
        return sink

    def file_done(self, step: int, phase: str, stats: FileStats) -> None:
        ints, strings = {"rank": self.rank, "step": step, "size": stats.nbytes}, {"fname": stats.name}
        self.emitter.emit(f"checkpoint.file.{'write' if phase == 'save' else 'read'}", FILE, stats.start,
                          stats.end, ints, strings)
        if stats.close_s:
            self.emitter.emit("checkpoint.file.close", FILE, stats.end - stats.close_s, stats.end, ints, strings)


def chunk_tracer(rank: int) -> Optional[ChunkTracer]:
    """A ChunkTracer when a trace is being written, else None."""
    return ChunkTracer(rank) if enabled() else None
