"""Stalls said while they happen: a rank whose checkpoint has had no request
complete for a while says so on its console, again while it lasts, and keeps
each stall (checkpoint, file, start, duration) for the record.

A frozen or unreachable store otherwise shows nothing until a timeout fires,
which may be minutes (s3dlio's limit is per attempt, and a stopped server that
keeps its connections open holds a request past it), or never, when the store
recovers and only the checkpoint's time hints at it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional


class StallWatch:
    """One rank's watch: begin() a checkpoint, progress() per completed chunk
    (request), end() after it; a daemon thread says a stall every limit_s seconds
    while it lasts through say(line)."""

    def __init__(self, rank: int, limit_s: float, where: Callable[[], str], say: Callable[[str], None]) -> None:
        self.rank, self.limit_s, self.where, self.say = rank, limit_s, where, say
        self.stalls: list[dict] = []
        self._lock = threading.Lock()
        self._active: Optional[tuple[str, int]] = None
        self._paused: Optional[tuple[str, int]] = None
        self._last = 0.0
        self._said = 0  # lines said for the stall going on now
        self._stalled_on = ""
        if limit_s > 0:
            threading.Thread(target=self._watch, name="stall-watch", daemon=True).start()

    def begin(self, phase: str, step: int) -> None:
        with self._lock:
            self._active, self._paused, self._last, self._said = (phase, step), None, time.time(), 0

    def resume(self) -> None:
        """After a pause (end() without a new begin()): the same checkpoint goes on."""
        with self._lock:
            if self._paused is not None:
                self._active, self._paused = self._paused, None
                self._last, self._said = time.time(), 0

    def progress(self, nbytes: int = 0) -> None:
        with self._lock:
            self._close(time.time())

    def end(self) -> None:
        with self._lock:
            self._close(time.time())
            self._active, self._paused = None, self._active

    def _close(self, now: float) -> None:
        """A request completed (or the checkpoint ended): the stall going on, if any, is over."""
        if self._said and self._active:
            phase, step = self._active
            self.stalls.append({"phase": phase, "step": step, "file": self._stalled_on, "start": self._last,
                                "duration_s": now - self._last})
        self._last, self._said = now, 0

    def _watch(self) -> None:
        tick = min(1.0, self.limit_s / 4)
        while True:
            time.sleep(tick)
            with self._lock:
                if self._active is None:
                    continue
                idle = time.time() - self._last
                if idle < self.limit_s * (self._said + 1):
                    continue
                self._said += 1
                if self._said == 1:
                    self._stalled_on = self.where()
                phase, step = self._active
                line = (f"[WARNING] rank {self.rank}: no {phase} request has completed for {idle:.0f} s "
                        f"(checkpoint {step}, {self._stalled_on}); still waiting")
            self.say(line)
