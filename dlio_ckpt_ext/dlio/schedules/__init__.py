"""The schedules behind a session's save and load, a module each behind one
small interface, as the layouts are:

- save(session, epoch, step, iteration, persistent) -> the files written in
  the foreground: synchronous (the save is the checkpoint's window),
  asynchronous (stage, persist in the background), tiered (every save to the
  local tier, every persistent_every-th also persisted in the background);
- load(session, epoch, step) -> the files read from the storage under test:
  a restore of the step asked for, or a recovery (the newest whole
  checkpoint found first, and in a tiered run the tier chosen).

`session` is the CheckpointSession; the choice is the run's settings'."""
from __future__ import annotations

from dlio_ckpt_ext.dlio.schedules import asynchronous, recovery, synchronous, tiered
from dlio_ckpt_ext.engine.profile import FileStats


def save(session, epoch: int, step: int, iteration: int, persistent: bool) -> list[FileStats]:
    schedule = tiered if session.tier is not None else asynchronous if session.config.is_async else synchronous
    return schedule.save(session, epoch, step, iteration, persistent)


def load(session, epoch: int, step: int) -> list[FileStats]:
    session.drain()
    if session.config.recovers:
        return recovery.load(session, epoch, step)
    return synchronous.load(session, epoch, step)
