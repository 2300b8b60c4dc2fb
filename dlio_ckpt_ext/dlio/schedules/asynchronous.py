"""The asynchronous schedule: a save stages the rank's state and returns; a
background thread persists it while training goes on (torchtitan's
async_mode, Megatron's persistent save), the blocked time and the persist
measured apart."""
from __future__ import annotations

import threading
import time

from dlio_ckpt_ext.checkpoint.priority import lower_this_thread
from dlio_ckpt_ext.dlio import progress, training
from dlio_ckpt_ext.results import windows
from dlio_ckpt_ext.engine.profile import FileStats, process_usage, usage_since


def save(session, epoch: int, step: int, iteration: int = 0, persistent: bool = True) -> list[FileStats]:
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
    start, usage, counted = time.time(), process_usage(), session.client_counts()
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
    session.local["save"].append(windows.local_record(label, files, start, end, usage_since(usage),
                                                   *session.client_since(counted)))
    session.files["save"].extend(files)
