"""The streaming checkpoint mechanism DLIO loads through
`checkpoint.checkpoint_mechanism_classname`.

It implements DLIO 2.0.0's abstract API (get_tensor, save_state, checkpoint,
finalize) and upstream DLIO's (get_tensor_core, save_state_core, load_state,
save_checkpoint, load_checkpoint, ...), so either DLIO can drive it. It never
allocates tensors: BaseCheckpointing.__init__ would allocate shard-sized
memory, so it is not called; bytes are generated into the Checkpointer's
bounded buffer pool instead.
"""
from __future__ import annotations

from typing import Optional

from dlio_benchmark.checkpointing.base_checkpointing import BaseCheckpointing
from dlio_benchmark.utils.utility import DLIOMPI

from dlio_ckpt_ext.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.dlio import context
from dlio_ckpt_ext.dlio.mpi import topology
from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.engine.stream import Progress


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
        self.comm = DLIOMPI.get_instance().comm()
        self.topology = topology(self.comm)
        self.run_config = load_config(context.get_workload(), self.topology.size)
        self.checkpointer = Checkpointer(self.run_config, self.topology.rank, self.topology.size,
                                         self.topology.ranks_per_node)
        self.checkpointer.prepare()
        #: per phase ("save", "load"): (step, files) in the order they ran
        self.records: dict[str, list[tuple[int, list[FileStats]]]] = {"save": [], "load": []}

    # -- the checkpoint operations -----------------------------------------
    def save_checkpoint(self, epoch: int, step_number: int, progress: Progress = None) -> list[FileStats]:
        files = self.checkpointer.save(step_number, epoch, progress)
        self.records["save"].append((step_number, files))
        return files

    def load_checkpoint(self, epoch: int, step_number: int, progress: Progress = None) -> list[FileStats]:
        files = self.checkpointer.load(step_number, epoch, progress)
        self.records["load"].append((step_number, files))
        return files

    def checkpoint(self, epoch: int, step_number: int) -> None:
        """DLIO 2.0.0's training-loop hook."""
        self.save_checkpoint(epoch, step_number)

    def finalize(self) -> None:
        self.checkpointer.close()

    # -- tensor API: nothing is ever held in memory ------------------------
    def get_tensor(self, size, datatype="int8"):
        return None

    def get_tensor_core(self, length, datatype="int8"):
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
