"""The save schedules behind a session's save (one small interface: save(session,
epoch, step, iteration, persistent) -> the files written in the foreground):
synchronous (the save is the checkpoint's window), asynchronous (stage, then
persist in the background: the blocked time and the persist measured apart),
and tiered (every save to the local tier in the foreground, every
persistent_every-th also persisted in the background)."""
from __future__ import annotations

import threading
import time

from dlio_ckpt_ext.checkpoint.priority import lower_this_thread
from dlio_ckpt_ext.dlio import metrics, progress, tiers, training
from dlio_ckpt_ext.engine.profile import FileStats, process_usage, usage_since


def save(session, epoch: int, step: int, iteration: int, persistent: bool) -> list[FileStats]:
    """The schedule the run's settings choose (`session`: the CheckpointSession)."""
    if session.tier is not None:
        return save_tiered(session, epoch, step, iteration, persistent)
    if session.config.is_async:
        return save_async(session, epoch, step)
    return session._checkpoint("save", epoch, step,
                               lambda s, e, bar: session.checkpointer.save(s, e, bar, session._barrier))


def save_async(session, epoch: int, step: int) -> list[FileStats]:
    """Wait for the previous persist, stage, start persisting, return: what
    blocks training. The staging copy and the wait are each measured."""
    label = session.label(step, epoch)
    with session.abort_on_error(f"checkpoint save {label}"), progress.span(session, "save", label):
        start = time.time()
        waited, wait_s = session.persister.wait()
        staged = session.checkpointer.stage(step, epoch)
        session.persisting_step = label
        session.persister.start(lambda: persist(session, epoch, step), name=f"persist-{label}")
        end = time.time()
    session.blocked.append({"step": label, "start": start, "end": end, "waited": waited, "wait_s": wait_s,
                         "staging_s": staged["staging_s"], "fill_s": staged["fill_s"],
                         "blocked_s": wait_s + staged["staging_s"], "call_s": end - start,
                         "bytes": staged["bytes"]})
    return []

def save_tiered(session, epoch: int, step: int, iteration: int, persistent: bool) -> list[FileStats]:
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
    session.tier_records.append(metrics.local_record(iteration, files, start, end, usage_since(usage)))
    training.io_windows().closed.append((start, end))
    if persistent:
        save_async(session, epoch, step)
    return []

def persist(session, epoch: int, step: int) -> None:
    """The background thread: the persist is this checkpoint's save (its
    window is what the save [METRIC] lines report). A tiered run's runs
    at the persistent tier's priority, and rank 0 says at once when one
    outlasts its interval."""
    late, label = None, session.label(step, epoch)
    if session.tier is not None:
        t = session.config.tiers
        session.persist_priority = lower_this_thread(t.persistent_nice, t.persistent_io)
        if session.rank == 0:
            late = threading.Timer(session.config.persistent_interval_s, progress.say_now, [
                f"[WARNING] persistent save of checkpoint {label} is still running after its interval of "
                f"{session.config.persistent_interval_s:g} s (workload.tiers.interval_s): the next persistent "
                "save (or the run's end) will wait for it"])
            late.daemon = True
            late.start()
    start, usage, retried = time.time(), process_usage(), session.checkpointer.backend.retry_counts()
    busy = training.io_windows()
    busy.open_since = start
    try:
        with progress.span(session, "persist", label):
            files = session.checkpointer.persist(step, epoch, session.persister.check, session.persist_comm.Barrier)
    finally:
        if late is not None:
            late.cancel()
    end = time.time()
    busy.closed.append((start, end))
    busy.open_since = None
    session.local["save"].append(metrics.local_record(label, files, start, end, usage_since(usage),
                                                   session._retries_since(retried)))
    session.files["save"].extend(files)
