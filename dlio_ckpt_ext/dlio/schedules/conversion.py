"""A load that needs its checkpoint converted first: DeepSpeed's ZeRO
checkpoint at another data-parallel size, read through its universal
checkpoint (docs/recovery.md). The conversion runs once a checkpoint on
every rank (checkpoint/universal.py), its figures gathered and summed on
rank 0 into session.conversions; the load then lists each parameter folder
it reads (load_hp_checkpoint_state's os.listdir) before its reads."""
from __future__ import annotations

from typing import Callable

from dlio_ckpt_ext.checkpoint import universal
from dlio_ckpt_ext.dlio import progress, trace
from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.shared_plans.universal_plan import universal_dir


def load_of(session, step: int, epoch: int) -> Callable[..., list[FileStats]]:
    """The load action of checkpoint (step, epoch), converting it first where the layout needs it."""
    ck = session.checkpointer
    if not ck.layout.converts(session.config.parallelism, ck.job):
        return ck.load
    directory = ck.directory(step, epoch)
    if ck.converted is None or ck.converted[0] != universal_dir(directory):
        with session.abort_on_error(f"converting {ck.backend.uri(directory)} to a universal checkpoint"), \
                trace.span("checkpoint.convert", rank=session.rank, step=step, size=0, files=0):
            figures = universal.convert(ck, directory, session.comm.barrier, progress.ticking(session, None), step)
            gathered = session.comm.gather(figures, root=0)
        if session.rank == 0:
            session.conversions.append({"checkpoint": directory, **universal.summary(ck, gathered)})

    def load(step: int, epoch: int, bar) -> list[FileStats]:
        universal.list_folders(ck, directory)
        return ck.load(step, epoch, bar)
    return load
