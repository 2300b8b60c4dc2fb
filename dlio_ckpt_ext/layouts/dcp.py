"""torch.distributed.checkpoint's layout for an FSDP-sharded model (torchtitan):
`step-{s}/__{rank}_0.distcp`, each rank's row shards of every tensor (the
parameter, then Adam's two moments), and a `.metadata` that rank 0 writes
once every rank has finished (DCP's commit: `.metadata.tmp`, fsync, rename).
A restore reads `.metadata` on every rank, then its data; at another world
size each saved item whose rows overlap the rank's new rows, whole (DCP's
planner and reader).

Sizes as a real save of torch 2.14.1 made them (fidelity/manifests,
docs/fidelity.md): every item wrapped by torch.save, and the optimizer's
replicated items (each parameter's `step` and param_groups' values) on the
ranks after 0, where DCP's deduplication put them."""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Optional

from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape
from dlio_ckpt_ext.shared_plans import load_plan, plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan, ShardFile

#: bytes of a .metadata per saved item: an estimate, for Megatron's (its own per-item
#: sizes are in megatron.py)
METADATA_ENTRY_BYTES = 200
#: DCP's FileSystemWriter writes `.metadata.tmp`, fsyncs it and renames it (finish())
METADATA_TMP = ".tmp"
#: the commit: rank 0 writes it last, and a restart trusts a step folder that holds it
METADATA = ".metadata"
#: what DCP saves per parameter for Adam: the parameter and its two moments
STATE_ENTRIES = 3
#: the FileSystemWriter saves each item with torch.save (SerializationFormat.TORCH_SAVE):
#: a tensor item is its bytes and a zip around them this much larger (torch 2.14.1, measured)
ITEM_OVERHEAD = 1577
#: the optimizer's replicated items of each parameter: its `step` (a 0-dim fp32 tensor,
#: wrapped) and param_groups' 11 values (lr, betas, eps, weight_decay, amsgrad, maximize,
#: foreach, capturable, differentiable, fused, decoupled_weight_decay), each a byte item
STEP_ITEM = 4 + ITEM_OVERHEAD
PARAM_GROUP_KEYS = 11
PARAM_GROUP_ITEM = 1261
#: .metadata, a pickle: about this much per key of the state dict (its planner data and
#: metadata) and per saved tensor chunk (its storage record); fitted to real saves at
#: 1 and 4 ranks, within 1.2 KB of the one at 2
METADATA_KEY_BYTES = 231
METADATA_CHUNK_BYTES = 237


def replicated_held(count: int, world: int, rank: int) -> range:
    """The replicated items (of `count`) rank's file holds: DCP's deduplication gives
    each to the smallest plan, which measured at 2 and 4 ranks spreads them evenly,
    in order, over every rank but 0 (rank 0 alone at 1): item i on rank
    1 + i (world - 1) // count. O(1)."""
    if world == 1:
        return range(count)
    if rank == 0:
        return range(0)
    first = lambda r: -(-(r - 1) * count // (world - 1))  # noqa: E731 - the first item of rank r
    return range(first(rank), first(rank + 1))


def _replicated_on(m: ModelShape, world: int, rank: int) -> tuple[int, int, range]:
    """(param_groups byte items, step items) rank's file holds, and which parameters' steps."""
    t = len(plan.dcp_tensors(m))
    steps = replicated_held(t, world, rank)
    return len(replicated_held(PARAM_GROUP_KEYS * t, world, rank)), len(steps), steps


def bytes_per_parameter(m: ModelShape) -> int:
    """Parameter plus Adam's two moments, no separate master copy (torchtitan
    trains in fp32 with mixed precision only in compute): 4 + 2 x 4 = 12 for fp32."""
    return (plan.dtype_bytes("model.model_datatype", m.model_datatype)
            + 2 * plan.dtype_bytes("model.optimizer_datatype", m.optimizer_datatype))


def rows_held(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[first, end) rows of a tensor's dim 0 that `rank` holds under FSDP."""
    first = rank * -(-rows // world)
    return first, first + plan.fsdp_rows(rows, world, rank)


@lru_cache(maxsize=4096)
def items(m: ModelShape, world: int, rank: int) -> list[tuple[int, int, int, int, int]]:
    """The tensor items of rank's `__{rank}_0.distcp` at world size `world`, in
    file order: (tensor index, first row, rows, offset, length), each item its
    whole torch.save blob (what DCP's reader reads). The byte items first, then
    the model's parameters, then per parameter its `step` where this rank holds
    it and its two moments, as a torchtitan state dict lists them
    ({"model": ..., "optimizer": ...})."""
    mbytes, obytes = (plan.DTYPE_BYTES[m.model_datatype], plan.DTYPE_BYTES[m.optimizer_datatype])
    tensors = plan.dcp_tensors(m)
    groups, _, steps = _replicated_on(m, world, rank)
    out, offset = [], groups * PARAM_GROUP_ITEM
    for dtype_bytes, entries in ((mbytes, 1), (obytes, 2)):
        for t, (rows, cols) in enumerate(tensors):
            if entries == 2 and t in steps:
                offset += STEP_ITEM
            mine = plan.fsdp_rows(rows, world, rank)
            if not mine:
                continue
            first = rank * -(-rows // world)
            for _ in range(entries):
                length = mine * cols * dtype_bytes + ITEM_OVERHEAD
                out.append((t, first, mine, offset, length))
                offset += length
    return out


def file_bytes(m: ModelShape, world: int, rank: int) -> int:
    """Rank's `.distcp`: its byte items, tensor items and steps."""
    groups, n_steps, _ = _replicated_on(m, world, rank)
    return groups * PARAM_GROUP_ITEM + n_steps * STEP_ITEM + sum(x[4] for x in items(m, world, rank))


def metadata_bytes(m: ModelShape, world: int) -> int:
    """.metadata: every key of the state dict (each parameter's weight, two moments,
    step and param_groups values) and every tensor chunk saved."""
    keys = (STATE_ENTRIES + 1 + PARAM_GROUP_KEYS) * len(plan.dcp_tensors(m))
    chunks = sum(STATE_ENTRIES for rank in range(world) for rows, _ in plan.dcp_tensors(m)
                 if plan.fsdp_rows(rows, world, rank))
    return METADATA_KEY_BYTES * keys + METADATA_CHUNK_BYTES * chunks


class DCP(Layout):
    name = "dcp"
    committed = True
    existence_probe = METADATA
    framework = "torch.distributed.checkpoint"
    reshards = "DCP's resharding (each saved item overlapping a rank's new rows, read whole)"
    durability = "each .distcp fsynced, then .metadata.tmp fsynced and renamed (no folder fsync)"

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return f"step-{step}"

    def find_latest(self, look: discovery.Look, expected: discovery.Expected) -> discovery.Latest:
        # torchtitan's _find_load_step, on every rank ("not remote friendly", its own comment)
        return discovery.by_probe(self, look, (METADATA, "model.safetensors.index.json"))

    def saved_shape(self, look: discovery.Look, name: str) -> Optional[SavedShape]:
        # DCP's read_metadata: the plan names every item's file, so its ranks
        return saved_shape.from_header(look.read(f"{name}/{METADATA}"), "DCP's .metadata plan")

    def check(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        for key, val in (("model.parallelism.tensor", p.tensor), ("model.parallelism.pipeline", p.pipeline)):
            if val != 1:
                raise ConfigError(key, val, "1 with checkpoint.layout dcp (FSDP shards every tensor "
                                            "across all ranks; tensor/pipeline layouts are not planned)")

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        world = p.data if p.mode == "subset" else world
        files = (ShardFile(f"__{rank}_0.distcp", file_bytes(m, world, rank), "state"),)
        commit = ()
        if rank == 0:
            commit = (ShardFile(METADATA, metadata_bytes(m, world), "metadata", self.shape_header(p, world),
                                tmp_suffix=METADATA_TMP),)
        return RankPlan(rank, rank, 0, 0, 0, files, commit)

    def metadata_reads(self, m: ModelShape, p: Parallelism, job: LoadJob) -> list[ReadRange]:
        """.metadata, read whole by every rank before its data (DCP's read_metadata)."""
        return [load_plan.whole(f, 0) for f in self.saved(m, p, job, 0).commit_files]

    def framework_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        if not job.resharded:
            return self.metadata_reads(m, p, job) + [load_plan.whole(f, rank) for f in self.saved(m, p, job, rank).files]
        return self.metadata_reads(m, p, job) + self._resharded(m, p, job, rank)

    def _resharded(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        """Every saved item whose rows overlap this rank's new rows, whole (DCP's
        planner asks for the overlap, its reader loads each saved item it touches
        whole and narrows it in memory), in saved rank and file order. Decided per
        distinct tensor shape (a layer's tensors repeat num_layers times): a saved
        file all of whose items are touched is one range, without walking them."""
        new_world, old_world = job.ranks, job.saved_ranks
        shapes = sorted(set(plan.dcp_tensors(m)))
        wanted = {shape: rows_held(shape[0], new_world, rank) for shape in shapes}
        candidates = sorted({s for (rows, _), (lo, hi) in wanted.items() if hi > lo
                             for s in range(lo // -(-rows // old_world), (hi - 1) // -(-rows // old_world) + 1)})
        tensors = plan.dcp_tensors(m)
        out: list[ReadRange] = []
        for s in candidates:
            f = self.saved(m, p, job, s).files[0]
            held = {shape: rows_held(shape[0], old_world, s) for shape in shapes}
            touched = {shape for shape in shapes
                       if held[shape][0] < held[shape][1] and held[shape][0] < wanted[shape][1]
                       and wanted[shape][0] < held[shape][1]}
            if all(shape in touched for shape in shapes if held[shape][0] < held[shape][1]):
                out.append(load_plan.whole(f, s))
                continue
            out += load_plan.coalesce(ReadRange(f.name, offset, length, s, f.size)
                                      for t, _, _, offset, length in items(m, old_world, s)
                                      if tensors[t] in touched)
        return out

    def candidate_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange) -> Iterable[int]:
        if job.pattern == "own":
            return super().candidate_readers(m, p, job, r)
        if not job.resharded:
            return [r.writer]
        found: set[int] = set()  # the new ranks whose rows meet the saved rank's, in any tensor
        for rows, _ in set(plan.dcp_tensors(m)):
            lo, hi = rows_held(rows, job.saved_ranks, r.writer)
            if hi > lo:
                per = -(-rows // job.ranks)
                found.update(range(lo // per, min(job.ranks, (hi - 1) // per + 1)))
        return sorted(found)

    def reads_inside_files(self, job: LoadJob) -> bool:
        return job.pattern != "own" and job.resharded


LAYOUT = DCP()
