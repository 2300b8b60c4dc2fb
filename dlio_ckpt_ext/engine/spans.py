"""The engine's hook for tracers, told of each stage of each chunk in the
thread that did it (a tracer stamps events with the calling thread, so a
fill on a generator thread or a read on a reader lane lands on that lane's
timeline, and stays nested under its own POSIX calls)."""
from __future__ import annotations

import time
from typing import Callable, Optional, Protocol

#: (stage, path, chunk index, offset, nbytes, start, end); stage is "fill",
#: "write", "read" or "verify"; start and end are time.time() seconds
SpanSink = Callable[[str, str, int, int, int, float, float], None]


class Tracer(Protocol):
    """What the checkpointer tells a tracer; it knows the step, the engine does not."""

    def chunk_sink(self, step: int) -> SpanSink: ...

    def file_done(self, step: int, phase: str, stats) -> None: ...


def stage_span(spans: Optional[SpanSink], stage: str, path: str, chunk_size: int):
    """A closure that reports one stage of a chunk that began at `start`
    (time.time()), or None without a sink so the hot path stays one test."""
    if spans is None:
        return None

    def done(offset: int, nbytes: int, start: float) -> None:
        spans(stage, path, offset // chunk_size if chunk_size else 0, offset, nbytes, start, time.time())
    return done
