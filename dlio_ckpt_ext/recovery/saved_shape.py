"""How a checkpoint was saved, as a restarting job's framework learns it from
the checkpoint itself (docs/recovery.md): the world size, the parallelism, the
devices a process. A job that comes back on fewer nodes, or more, reads this
first and reshards; nothing in the job's own settings says it.

Each layout reads its framework's own record (Layout.saved_shape): DCP's and
Megatron's `.metadata` (a pickled plan there; a JSON line at its head here,
SHAPE_HEADER, the rest of the file its planned size), Orbax's `_sharding`
(every device of the mesh) and its `ocdbt.process_*` folders, DeepSpeed's and
DLIO's file names. Pure: no MPI, no storage beyond the counted Look.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Optional

from dlio_ckpt_ext.shared_plans.load_plan import LoadJob
from dlio_ckpt_ext.shared_plans.plan import Parallelism

#: the head of a `.metadata` we write: the save's shape, one JSON line (a real DCP
#: `.metadata` pickles its plan: every item's file, which names the ranks)
SHAPE_KEY = "saved_by"
#: bytes a reader asks for to find the head line
HEAD_BYTES = 512


@dataclass(frozen=True)
class SavedShape:
    """The save's world size and what else its record says (None: it does not say)."""
    world: int
    #: where it was read: "DCP's .metadata plan", "the zero_pp_rank names"
    source: str
    tensor: Optional[int] = None
    pipeline: Optional[int] = None
    #: tensor x pipeline, where the names give only their product (DeepSpeed's mp_rank)
    model_parallel: Optional[int] = None
    zero_stage: Optional[int] = None
    devices_per_rank: Optional[int] = None

    @property
    def data(self) -> Optional[int]:
        mp = self.model_parallel or ((self.tensor or 1) * (self.pipeline or 1) if self.tensor else None)
        return self.world // mp if mp else None

    def describe(self) -> str:
        """'4 ranks, TP 1 PP 1 DP 4' (what the record says, no more)."""
        parts = [f"{self.world} ranks"]
        if self.tensor is not None:
            parts.append(f"TP {self.tensor} PP {self.pipeline}")
        elif self.model_parallel is not None:
            parts.append(f"MP {self.model_parallel}")
        if self.data is not None:
            parts.append(f"DP {self.data}")
        if self.zero_stage is not None:
            parts.append(f"ZeRO-{self.zero_stage}")
        if self.devices_per_rank is not None:
            parts.append(f"{self.devices_per_rank} device{'s' if self.devices_per_rank > 1 else ''} a process")
        return ", ".join([parts[0], " ".join(parts[1:])]) if len(parts) > 1 else parts[0]

    def disagreements(self, p: Parallelism) -> list[tuple[str, int, int]]:
        """(key, saved, this run's) for each setting the record fixes and the run
        sets otherwise: a restore at another world size keeps the rest."""
        mine = {"model.parallelism.tensor": (self.tensor, p.tensor),
                "model.parallelism.pipeline": (self.pipeline, p.pipeline),
                "model.parallelism.tensor x pipeline": (self.model_parallel, p.tensor * p.pipeline),
                "model.parallelism.zero_stage": (self.zero_stage, p.zero_stage),
                "checkpoint.devices_per_rank": (self.devices_per_rank, p.devices)}
        return [(k, saved, run) for k, (saved, run) in mine.items() if saved is not None and saved != run]

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def header(world: int, p: Parallelism) -> bytes:
    """The head line a `.metadata` of ours starts with."""
    shape = {"world_size": world, "tensor": p.tensor, "pipeline": p.pipeline, "zero_stage": p.zero_stage}
    return (json.dumps({SHAPE_KEY: shape}, separators=(",", ":")) + "\n").encode()


def from_header(head: Optional[bytes], source: str) -> Optional[SavedShape]:
    """The shape a `.metadata`'s head line records; None where it has none."""
    if not head:
        return None
    try:
        shape = json.loads(head.split(b"\n", 1)[0])[SHAPE_KEY]
        return SavedShape(int(shape["world_size"]), source, int(shape["tensor"]), int(shape["pipeline"]),
                          zero_stage=int(shape["zero_stage"]))
    except (ValueError, KeyError, TypeError):
        return None


_ZERO = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(?:optim|model)_states\.pt$")


def from_deepspeed_names(names: list[str]) -> Optional[SavedShape]:
    """DeepSpeed's files name their data- and model-parallel ranks
    (`zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt`): the save's DP x MP.
    None where only data-parallel rank 0's are there: DP 1, or ZeRO-0, whose
    files are the same at any data-parallel size."""
    ranks = [(int(m[1]), int(m[2])) for n in names if (m := _ZERO.search(n))]
    if not ranks:
        return None
    dp, mp = max(d for d, _ in ranks) + 1, max(m for _, m in ranks) + 1
    if dp == 1:
        return None
    return SavedShape(dp * mp, "the zero_pp_rank_*_mp_rank_* names (DeepSpeed's glob)", model_parallel=mp)


def from_orbax(sharding: Optional[bytes], processes: int) -> Optional[SavedShape]:
    """Orbax's `_sharding` lists every device of each array's mesh; its
    `ocdbt.process_*` folders are the processes that wrote: devices a process
    is their quotient."""
    if not sharding or not processes:
        return None
    try:
        first = json.loads(next(iter(json.loads(sharding).values())))
        devices = len(first["device_mesh"]["mesh"])
    except (ValueError, KeyError, TypeError, StopIteration):
        return None
    if devices % processes:
        return None
    return SavedShape(processes, "items/_sharding's device mesh and the ocdbt.process_* folders",
                      devices_per_rank=devices // processes)


def resume_pattern(pattern: str, saved_ranks: int, ranks: int) -> str:
    """What a resume reads: a checkpoint saved at another world size is read as
    its framework reshards it (restore=own reads a rank's own files, which at
    another size no rank has)."""
    return "framework" if pattern == "own" and saved_ranks not in (0, ranks) else pattern


def resumed_job(job: LoadJob, saved: Optional[SavedShape], configured: int, p: Parallelism,
                where: str) -> tuple[LoadJob, Optional[str]]:
    """The load a resume makes of the checkpoint in `where`, given what its
    record says (saved; None: it says nothing, and checkpoint.saved_ranks or
    this run's size stands), or a one-line refusal naming both values."""
    if saved is None:
        return job, None
    if configured and configured != saved.world:
        return job, (f"workload.checkpoint.saved_ranks={configured} disagrees with {where}: its {saved.source} says "
                     f"it was saved by {saved.world} ranks (leave saved_ranks unset: the checkpoint says)")
    wrong = saved.disagreements(p)
    if wrong:
        key, was, now = wrong[0]
        return job, (f"workload.{key}={now} disagrees with {where}: saved with {was} (its {saved.source}); a "
                     "restore at another size keeps the parallelism it was saved with")
    return replace(job, saved_ranks=saved.world, pattern=resume_pattern(job.pattern, saved.world, job.ranks),
                   shift=job.shift if saved.world == job.ranks else 0), None
