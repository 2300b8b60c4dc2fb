"""What a rank says while a checkpoint runs: the per-chunk tick (the stall
watch's clock, rank 0's bar), where a stall is, lines that must reach the
person now, the trace's span of an operation, and rank 0's progress bar."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Optional

from tqdm import tqdm

from dlio_ckpt_ext.dlio import trace
from dlio_ckpt_ext.dlio.mpi import user_terminal


def ticking(session, bar: Optional[Callable[[int], None]]) -> Callable[[int], None]:
    """The engine's per-chunk callback: the stall watch's clock, and rank 0's bar."""
    def tick(nbytes: int) -> None:
        session.stall_watch.progress(nbytes)
        if bar is not None:
            bar(nbytes)
    return tick

def stalled_where(session) -> str:
    if session.tier is not None and session.tier.current_file:
        return f"file {session.tier.backend.uri(session.tier.current_file)} (the local tier)"
    backend = session.checkpointer.backend
    endpoint = backend.describe().get("endpoint_url")
    return (f"file {backend.uri(session.checkpointer.current_file)}"
            + (f", endpoint {endpoint}" if endpoint else ""))

def say_now(line: str) -> None:
    """A line that must reach the person now: stderr, and their terminal when
    mpirun's is one (over rank 0's progress bar, if one is drawn)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    term = user_terminal()
    if term is not None and term is not sys.stdout:
        with contextlib.suppress(OSError):
            term.write("\r\033[K" + line + "\n")
            term.close()

def span(session, what: str, step: int):
    """The trace's span of one checkpoint operation on this rank."""
    ck = session.checkpointer
    if what == "load":
        size, files = ck.load_bytes(), len(ck.reads())
    elif what == "local":
        size, files = session.tier.bytes_per_save, len(session.tier.group)
    else:
        mine = ck.rank_plan(ck.rank)
        size, files = ck.rank_bytes(ck.rank), len(mine.files) + len(mine.commit_files)
    return trace.span(f"checkpoint.{what}", rank=session.rank, step=step, size=size, files=files)

@contextlib.contextmanager
def progress(session, phase: str, step: int):
    """Rank 0's own bytes of this checkpoint, with rate and ETA, on a terminal
    only (a log file gets the [INFO] lines). Updated from the I/O thread once
    per chunk; its cost is measured by bench/engine_bench.py."""
    term = user_terminal() if session.rank == 0 else None
    if term is None:
        yield None
        return
    ck = session.checkpointer
    c = session.config.checkpoint
    count = c.num_checkpoints_write if phase == "save" else c.num_checkpoints_read
    total = ck.rank_bytes(ck.rank) if phase == "save" else ck.load_bytes()
    try:
        width = os.get_terminal_size(term.fileno()).columns or 100
    except OSError:
        width = 100
    try:
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False, file=term,
                  ncols=width, desc=f"rank 0 {phase} {step}/{count}") as bar:
            yield bar.update
    finally:
        if term is not sys.stdout:
            term.close()
