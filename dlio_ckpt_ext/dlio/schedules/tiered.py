"""The tiered schedule: every checkpoint to the local tier in the foreground
(NVIDIA's local checkpoints), every persistent_every-th also persisted to the
storage under test in the background (the asynchronous schedule)."""
from __future__ import annotations

import time

from dlio_ckpt_ext.dlio import progress, tiers, training
from dlio_ckpt_ext.results import windows
from dlio_ckpt_ext.dlio.schedules import asynchronous
from dlio_ckpt_ext.engine.profile import FileStats, process_usage, usage_since


def save(session, epoch: int, step: int, iteration: int, persistent: bool) -> list[FileStats]:
    """Tiers: every checkpoint to the local tier in the foreground (named by
    its training iteration, as NVRx names it), every persistent_every-th
    also persisted to the storage under test in the background."""
    with session.abort_on_error(f"local checkpoint save {iteration}"), progress.span(session, "local", iteration):
        start, usage = time.time(), process_usage()
        session.stall_watch.begin("local save", iteration)
        try:
            files = tiers.save_local(session.tier, iteration, progress.ticking(session, None), session._barrier)
        finally:
            session.stall_watch.end()
            session.tier.current_file = ""
        end = time.time()
    session.tier_records.append(windows.local_record(iteration, files, start, end, usage_since(usage)))
    training.io_windows().closed.append((start, end))
    if persistent:
        asynchronous.save(session, epoch, step)
    return []
