"""The synchronous schedule: a save or a load is the checkpoint's window, on every rank."""
from __future__ import annotations

from dlio_ckpt_ext.dlio.schedules import conversion
from dlio_ckpt_ext.engine.profile import FileStats


def save(session, epoch: int, step: int, iteration: int = 0, persistent: bool = True) -> list[FileStats]:
    return session._checkpoint("save", epoch, step,
                               lambda s, e, bar: session.checkpointer.save(s, e, bar, session._barrier))


def load(session, epoch: int, step: int) -> list[FileStats]:
    """The step asked for (DLIO's loop names it), read as the layout restores it."""
    return session._checkpoint("load", epoch, step, conversion.load_of(session, session.config.read_step(step), epoch))
