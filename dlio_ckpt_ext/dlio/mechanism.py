"""The streaming checkpoint mechanism DLIO loads through
`checkpoint.checkpoint_mechanism_classname`.

It implements DLIO 2.0.0's abstract API (get_tensor, save_state, checkpoint,
finalize) and upstream DLIO's (get_tensor_core, save_state, load_state,
save_checkpoint, load_checkpoint, ...), so either DLIO's checkpoint loop
drives it; all the work is in CheckpointSession. It never allocates tensors:
BaseCheckpointing.__init__ would allocate shard-sized memory, so it is not
called, and what upstream reads from a mechanism (checkpoint_size) is set here
with upstream's meaning.
"""
from __future__ import annotations

from typing import Optional

from dlio_benchmark.checkpointing.base_checkpointing import BaseCheckpointing
from dlio_benchmark.utils.config import ConfigArguments
from dlio_benchmark.utils.utility import DLIOMPI

from dlio_ckpt_ext.dlio import context
from dlio_ckpt_ext.dlio.provenance import dlio_has_checkpoint_workflow
from dlio_ckpt_ext.dlio.session import CheckpointSession
from dlio_ckpt_ext.engine.profile import GiB, FileStats


class StreamingCheckpointing(BaseCheckpointing):
    __instance: Optional["StreamingCheckpointing"] = None

    @classmethod
    def get_instance(cls) -> "StreamingCheckpointing":
        if StreamingCheckpointing.__instance is None:
            StreamingCheckpointing.__instance = cls()
        return StreamingCheckpointing.__instance

    @classmethod
    def reset(cls) -> None:
        StreamingCheckpointing.__instance = None

    def __init__(self) -> None:  # noqa: D107 - BaseCheckpointing.__init__ deliberately not called
        self.ext = "pt"
        args = ConfigArguments.get_instance()
        self.comm = DLIOMPI.get_instance().comm()
        upstream = dlio_has_checkpoint_workflow()
        self.session = CheckpointSession(context.get_workload(), self.comm, args.output_folder,
                                         dlio_reports_metrics=upstream,
                                         dlio_rank_sync=args.checkpoint_rank_sync if upstream else None)
        #: what upstream's StatsCounter divides by each checkpoint's duration:
        #: GiB of one whole checkpoint, all ranks (BaseCheckpointing's meaning)
        self.checkpoint_size = self.session.checkpoint_bytes / GiB
        if self.session.config.trains and hasattr(args, "num_checkpoints_read"):
            # DLIO's training loop reads no checkpoint, but upstream's and the fork's
            # StatsCounter.end_run print load figures whenever this is > 0 and fail on
            # rank 0 without them (KeyError), leaving the other ranks waiting: the
            # reads after training are ours (session.finalize), from our own config
            args.num_checkpoints_read = 0

    # -- the checkpoint operations -----------------------------------------
    def save_checkpoint(self, epoch: int, step_number: int) -> list[FileStats]:
        return self.session.save(epoch, step_number)

    def load_checkpoint(self, epoch: int, step_number: int) -> list[FileStats]:
        return self.session.load(epoch, step_number)

    def checkpoint(self, epoch: int, step_number: int) -> None:
        """DLIO 2.0.0's training-loop hook."""
        self.save_checkpoint(epoch, step_number)

    def finalize(self) -> None:
        self.session.finalize()

    # -- tensor API: nothing is ever held in memory ------------------------
    def get_tensor(self, size, datatype="int8"):
        return None

    def get_tensor_core(self, length, datatype="int8", randomize=True):
        return None

    def get_tensor_length(self, tensor) -> int:
        return 0

    def get_tensor_dtype_str(self, tensor) -> str:
        return "int8"

    def set_madvise_mergeable(self, tensor) -> bool:
        return False

    def save_state(self, suffix, state, fsync=False):
        raise NotImplementedError("StreamingCheckpointing streams whole checkpoints; "
                                  "use save_checkpoint(epoch, step)")

    save_state_core = save_state

    def load_state(self, suffix, state, fsync=False):
        raise NotImplementedError("StreamingCheckpointing streams whole checkpoints; "
                                  "use load_checkpoint(epoch, step)")
