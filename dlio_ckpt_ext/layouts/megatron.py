"""Megatron-core's `dist_checkpointing` in format `torch_dist`, as Megatron-LM
writes it (docs/layouts.md has the sources read):

- `iter_{7 digits}/__{rank}_0.distcp` on every rank: torch.distributed.checkpoint's
  files, one a rank (a synchronous save's thread_count, 1 since Megatron-core 0.17);
  rank 0's also holds the common state (no common.pt since 0.19), DP rank 0 of each
  model-parallel position its RNG state;
- `.metadata` (DCP's, a pickled index of every item) by rank 0 once every rank's
  data is down, then `metadata.json` (the backend's name and version);
- `latest_checkpointed_iteration.txt` at the save root, written last.

What each rank writes is the fully parallel save (FullyParallelSaveStrategyWrapper):
a tensor replicated across the data-parallel group is written once, by the
member that determine_main_replica_uniform_distribution picks (each group's
shards, the distributed optimizer's own parts first, then the replicated ones
largest first, each to the least loaded member), so every rank writes about
total / world. The tensors are Megatron's LLaMA ones (fused QKV, fused
gate/up, layer norms fused into the linear layers, the vocabulary padded to
a multiple of 128 x TP), split as its tensor and pipeline parallelism split
them; the distributed optimizer's fp32 main parameters and Adam's two moments
are sharded over the data-parallel group (fully_sharded_model_space).

Ranks are numbered as Megatron's default order (tp-cp-ep-dp-pp): tensor-parallel
fastest, then data-parallel, then pipeline stage.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Optional

from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape
from dlio_ckpt_ext.shared_plans import load_plan, plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.layouts.dcp import ITEM_OVERHEAD, METADATA_TMP
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan, ShardFile

#: metadata.json as dist_checkpointing's save_config writes it (json.dump of CheckpointingConfig;
#: Megatron-core 0.19 dropped the common backend's two keys with common.pt)
METADATA_JSON = json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}).encode()
#: byte items (ShardedObjects, pickled), as a Megatron-LM save with megatron-core 0.19.2 wrote
#: them (fidelity/manifests): the common state (args, iteration, scheduler) in rank 0's file;
#: each linear layer's _extra_state in tensor-parallel rank 0's of its stage; in data-parallel
#: rank 0's of each model-parallel position its RNG state and the distributed optimizer's
#: three objects (its param groups, per_bucket_numel and per_bucket_numel_unpadded)
COMMON_STATE_BYTES = 30317
EXTRA_STATE_BYTES = 1261
LINEARS_PER_LAYER = 4   # linear_qkv, linear_proj, linear_fc1, linear_fc2
RNG_STATE_BYTES = 15449
OPTIMIZER_OBJECT_BYTES = (1837, 1325, 1325)
#: .metadata: about this many bytes a saved item (tensor chunk or object), measured 299-330
#: on real saves at TP 1 and 2 and DP 1, 2 and 4
METADATA_ITEM_BYTES = 313
#: --overlap-grad-reduce (the 8B recipe's): the distributed optimizer's DDP buckets of
#: max(40M, 1M x DP) parameters (DistributedDataParallelConfig.bucket_size's default)
BUCKET_PARAMETERS, BUCKET_PARAMETERS_PER_DP = 40_000_000, 1_000_000
TRACKER = "latest_checkpointed_iteration.txt"


def _format_probes(look, name: str) -> None:
    """_get_checkpoint_format on every rank: the iteration folder listed, then
    check_is_distributed_checkpoint's metadata.json probed and read."""
    look.list(name)
    if look.exists(f"{name}/metadata.json"):
        look.read(f"{name}/metadata.json")


def _iteration(text: bytes) -> Optional[int]:
    """The tracker's iteration (Megatron's read_metadata; "release" and anything else: none)."""
    value = text.decode(errors="replace").strip()
    return int(value) if value.isdigit() else None
#: Megatron pads the vocabulary to a multiple of this x tensor parallelism (--make-vocab-size-divisible-by)
VOCAB_DIVISOR = 128
#: the distributed optimizer's states per parameter: fp32 main parameter, exp_avg, exp_avg_sq
OPTIMIZER_STATES = ("fp32_param", "exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Piece:
    """One saved item: a tensor's chunk on one model-parallel position (a weight),
    or a data-parallel rank's part of its optimizer state."""
    name: str
    elements: int
    itemsize: int
    #: the data-parallel ranks holding it: every one for a weight (replicated),
    #: one for an optimizer part
    replicated: bool
    #: optimizer parts: [first, end) elements of the parameter's flat state
    first: int = 0
    #: replicated across tensor-parallel ranks too (a norm): saved by TP rank 0's group
    tp_shared: bool = False

    @property
    def nbytes(self) -> int:
        """The tensor's bytes (what the fully parallel save balances)."""
        return self.elements * self.itemsize

    @property
    def size(self) -> int:
        """Its bytes in the file: the tensor wrapped by torch.save (DCP's item format)."""
        return self.nbytes + ITEM_OVERHEAD


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary Megatron allocates: a multiple of 128 x TP (_vocab_size_with_padding)."""
    step = VOCAB_DIVISOR * tp
    return -(-vocab // step) * step


def parameters(m: ModelShape, tp: int, pp: int, tp_rank: int, pp_rank: int) -> list[tuple[str, int, bool]]:
    """(name, elements on this tensor-parallel rank, replicated across TP) of
    the parameters of one model-parallel position, in registration order."""
    h, f = m.hidden_size, m.ffn_hidden_size
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    vp = padded_vocab(m.vocab_size, tp)
    first, last = plan.layer_range(pp_rank, pp, m.num_layers)
    out: list[tuple[str, int, bool]] = []
    if first == 0:
        out.append(("embedding.word_embeddings.weight", vp // tp * h, False))
    for layer in range(max(first, 1), min(last, m.num_layers) + 1):
        p = f"decoder.layers.{layer - 1}."
        out += [(p + "self_attention.linear_qkv.layer_norm_weight", h, True),
                (p + "self_attention.linear_qkv.weight", (h + 2 * dkv) // tp * h, False),
                (p + "self_attention.linear_proj.weight", h * (h // tp), False),
                (p + "mlp.linear_fc1.layer_norm_weight", h, True),
                (p + "mlp.linear_fc1.weight", 2 * f // tp * h, False),
                (p + "mlp.linear_fc2.weight", h * (f // tp), False)]
    if last == m.num_layers + 2:
        out += [("decoder.final_layernorm.weight", h, True), ("output_layer.weight", vp // tp * h, False)]
    return out


def num_parameters(m: ModelShape, tp: int, pp: int) -> int:
    """Parameters Megatron allocates and saves, all positions (the padded vocabulary included)."""
    return sum(n for pp_rank in range(pp) for tp_rank in range(tp)
               for _, n, replicated in parameters(m, tp, pp, tp_rank, pp_rank) if tp_rank == 0 or not replicated)


@dataclass(frozen=True)
class Grid:
    """Megatron's rank order at one world size: tensor, then data-parallel, then pipeline."""
    tp: int
    pp: int
    dp: int

    def position(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of a global rank."""
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)


def _grid(p: Parallelism, world: int) -> Grid:
    return Grid(p.tensor, p.pipeline, world // (p.tensor * p.pipeline))


@lru_cache(maxsize=1024)
def _saved_pieces(m: ModelShape, p: Parallelism, world: int, tp_rank: int, pp_rank: int
                  ) -> tuple[tuple[tuple[Piece, ...], ...], tuple[Piece, ...]]:
    """One data-parallel group's save (the ranks at one model-parallel position):
    for each member, the pieces its file holds in file order (its weights, then
    its optimizer parts), and the weights the group holds in model order."""
    grid = _grid(p, world)
    mbytes = plan.dtype_bytes("model.model_datatype", m.model_datatype)
    obytes = plan.dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
    params = parameters(m, grid.tp, grid.pp, tp_rank, pp_rank)
    # the TP-replicated norms are saved by tensor-parallel rank 0's group only (their main replica)
    weights = tuple(piece for name, n, shared in params if tp_rank == 0 or not shared
                    for piece in _weight_chunks(name, n, mbytes, shared))
    optim = _optimizer_parts(params, grid.dp, obytes, bucket_size(p, grid.dp))
    loads = [sum(x.nbytes for x in optim[d]) for d in range(grid.dp)]
    held: list[list[Piece]] = [[] for _ in range(grid.dp)]
    # determine_main_replica_uniform_distribution: each replicated shard goes to the least
    # loaded member, the largest first (ties: by name, then the lowest rank)
    for piece in sorted(weights, key=lambda x: (-x.nbytes, x.name)):
        d = min(range(grid.dp), key=lambda i: (loads[i], i))
        held[d].append(piece)
        loads[d] += piece.nbytes
    order = {(x.name, x.first): i for i, x in enumerate(weights)}
    files = tuple(tuple(sorted(held[d], key=lambda x: order[(x.name, x.first)])) + optim[d] for d in range(grid.dp))
    return files, weights


def _weight_chunks(name: str, elements: int, itemsize: int, shared: bool) -> tuple[Piece, ...]:
    """The saved chunks of one weight on one tensor-parallel rank: one, but
    SwiGLU's fused gate/up, saved as its two halves (apply_swiglu_sharded_factory)."""
    if name.endswith("linear_fc1.weight"):
        half = elements // 2
        return (Piece(name, half, itemsize, True, 0, shared), Piece(name, elements - half, itemsize, True, half, shared))
    return (Piece(name, elements, itemsize, True, 0, shared),)


def bucket_size(p: Parallelism, dp: int) -> int:
    """Parameters a DDP bucket closes at: --overlap-grad-reduce's, or 0 (none: one
    bucket the whole buffer)."""
    return max(BUCKET_PARAMETERS, BUCKET_PARAMETERS_PER_DP * dp) if p.overlap_grad_reduce else 0


def buckets(params: list[tuple[str, int, bool]], size: int) -> list[list[tuple[str, int, bool]]]:
    """The grad buffer's buckets: its parameters in reverse registration order, a
    bucket closed once it holds `size` parameters or more (0: one bucket)."""
    out: list[list[tuple[str, int, bool]]] = [[]]
    held = 0
    for param in reversed(params):
        if size and held >= size:
            out.append([])
            held = 0
        out[-1].append(param)
        held += param[1]
    return [b for b in out if b]


def _optimizer_parts(params: list[tuple[str, int, bool]], dp: int, itemsize: int,
                     bucket: int = 0) -> tuple[tuple[Piece, ...], ...]:
    """The distributed optimizer's parts on each data-parallel rank, as its
    dp_reshardable save writes them: each DDP bucket of the model position's
    grad buffer split evenly over the group; for each bucket a rank saves the
    fp32 main parameters of its slice, then their exp_avg, then their
    exp_avg_sq, a chunk a parameter. Every tensor-parallel rank saves its own
    buffer, the replicated norms' state included."""
    out: list[list[Piece]] = [[] for _ in range(dp)]
    for members in buckets(params, bucket):
        per = -(-sum(n for _, n, _ in members) // dp)
        slices: list[list[tuple[str, int, int]]] = [[] for _ in range(dp)]
        at = 0
        for name, n, _ in members:
            lo = at
            while lo < at + n:
                d = lo // per
                hi = min(at + n, (d + 1) * per)
                slices[d].append((name, hi - lo, lo - at))
                lo = hi
            at += n
        for d in range(dp):
            out[d] += [Piece(f"optimizer.{state}.{name}", count, itemsize, False, first)
                       for state in OPTIMIZER_STATES for name, count, first in slices[d]]
    return tuple(tuple(x) for x in out)


def _objects(m: ModelShape, grid: Grid, rank: int) -> tuple[int, ...]:
    """The byte items a rank's file starts with (DCP writes byte items first)."""
    tp_rank, dp_rank, pp_rank = grid.position(rank)
    if dp_rank:
        return ()
    first, last = plan.layer_range(pp_rank, grid.pp, m.num_layers)
    layers = len(range(max(first, 1), min(last, m.num_layers) + 1))
    return (((COMMON_STATE_BYTES,) if rank == 0 else ())
            + ((EXTRA_STATE_BYTES,) * LINEARS_PER_LAYER * layers if tp_rank == 0 else ())
            + (RNG_STATE_BYTES,) + OPTIMIZER_OBJECT_BYTES)


class Megatron(Layout):
    name = "megatron"
    committed = True
    has_buckets = True
    framework = "Megatron-core dist_checkpointing (torch_dist)"
    reshards = "Megatron's fully parallel load over the new grid"
    durability = ("each .distcp fsynced, .metadata.tmp fsynced and renamed; metadata.json and the tracker "
                  "written without fsync")

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return f"iter_{step:07d}"

    def tracker(self, step: int) -> tuple[str, bytes]:
        """The file at the save root naming the last whole checkpoint, and its content."""
        return TRACKER, str(step).encode()

    def find_latest(self, look: discovery.Look, expected: discovery.Expected) -> discovery.Latest:
        # read_metadata on every rank, then the max all-reduce of _load_base_checkpoint
        return discovery.by_tracker(self, look, TRACKER, _iteration, expected, _format_probes)

    def saved_shape(self, look: discovery.Look, name: str) -> Optional[SavedShape]:
        # load_common and the sharded metadata: the saved TP, PP and world the load reshards from
        return saved_shape.from_header(look.read(f"{name}/.metadata"), "Megatron's sharded metadata (.metadata)")

    def check(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        if p.mode != "default":
            raise ConfigError("checkpoint.mode", p.mode, "default with checkpoint.layout megatron (every rank "
                                                         "of the job saves its part)")
        if p.zero_stage != 1:
            raise ConfigError("model.parallelism.zero_stage", p.zero_stage,
                              "1 with checkpoint.layout megatron (Megatron's distributed optimizer shards the "
                              "optimizer over data-parallel ranks: ZeRO-1)")
        if m.hidden_size % m.num_attention_heads or m.ffn_hidden_size % p.tensor:
            raise ConfigError("model.transformer.ffn_hidden_size", m.ffn_hidden_size,
                              f"a multiple of tensor parallelism {p.tensor}, with hidden_size a multiple of "
                              "num_attention_heads (Megatron splits whole heads and whole MLP columns)")

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        grid = _grid(p, world)
        tp_rank, dp_rank, pp_rank = grid.position(rank)
        files, _ = _saved_pieces(m, p, world, tp_rank, pp_rank)
        data = ShardFile(f"__{rank}_0.distcp", sum(_objects(m, grid, rank)) + sum(x.size for x in files[dp_rank]),
                         "state")
        commit = ()
        if rank == 0:
            items = sum(len(_saved_pieces(m, p, world, t, s)[0][d]) + len(_objects(m, grid, grid.rank(t, d, s)))
                        for s in range(grid.pp) for t in range(grid.tp) for d in range(grid.dp))
            commit = (ShardFile(".metadata", METADATA_ITEM_BYTES * items, "metadata", self.shape_header(p, world),
                                tmp_suffix=METADATA_TMP),
                      ShardFile("metadata.json", len(METADATA_JSON), "metadata", METADATA_JSON))
        return RankPlan(rank, dp_rank, tp_rank + grid.tp * pp_rank, pp_rank, tp_rank, (data,), commit)

    def facts(self, m: ModelShape, p: Parallelism, world: int) -> list[str]:
        grid = _grid(p, world)
        size = bucket_size(p, grid.dp)
        count = len(buckets(parameters(m, grid.tp, grid.pp, 0, 0), size))
        items = [sum(1 for x in _saved_pieces(m, p, world, t, s)[0][d] if x.name.startswith("optimizer."))
                 for s in range(grid.pp) for t in range(grid.tp) for d in range(grid.dp)]
        how = (f"of at least {size:,} parameters (--overlap-grad-reduce at DP {grid.dp})" if size else
               "(overlap_grad_reduce off: the whole buffer)")
        return [f"DDP buckets: {count} a model-parallel position {how}; optimizer items a rank "
                f"{min(items)}-{max(items)}"]

    # -- loads ----------------------------------------------------------------
    def metadata_reads(self, m: ModelShape, p: Parallelism, job: LoadJob) -> list[ReadRange]:
        """.metadata and metadata.json, read whole by every rank first (load_common, then DCP's read_metadata)."""
        return [load_plan.whole(f, 0) for f in self.saved(m, p, job, 0).commit_files]

    def framework_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        return list(_framework_reads(self, m, p, job, rank))

    def candidate_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange) -> Iterable[int]:
        if job.pattern == "own":
            return super().candidate_readers(m, p, job, r)
        # a weight is read by every rank of its pipeline stage that holds it (its TP rank's
        # data-parallel group, or every TP rank for a norm); an optimizer part by its rank
        grid = _grid(p, job.ranks)
        saved = _grid(p, job.saved_ranks)
        _, _, pp_rank = saved.position(r.writer)
        return [grid.rank(t, d, pp_rank) for t in range(grid.tp) for d in range(grid.dp)]

    def reads_inside_files(self, job: LoadJob) -> bool:
        return job.pattern != "own"


def _pieces_at(layout: Megatron, m: ModelShape, p: Parallelism, world: int) -> dict:
    """Where every saved piece is: (pp_rank, its TP rank (0 for a norm), name, first) -> (writer, offset, size)."""
    grid = _grid(p, world)
    out = {}
    for s in range(grid.pp):
        for t in range(grid.tp):
            files, _ = _saved_pieces(m, p, world, t, s)
            for d in range(grid.dp):
                offset = sum(_objects(m, grid, grid.rank(t, d, s)))
                for x in files[d]:
                    out[(s, 0 if x.tp_shared else t, x.name, x.first)] = (grid.rank(t, d, s), offset, x.size)
                    offset += x.size
    return out


_where = lru_cache(maxsize=64)(_pieces_at)


@lru_cache(maxsize=256)
def _position_parts(m: ModelShape, p: Parallelism, world: int, tp_rank: int, pp_rank: int
                    ) -> tuple[tuple[Piece, ...], ...]:
    """A model-parallel position's optimizer parts on each data-parallel rank (element counts)."""
    grid = _grid(p, world)
    return _optimizer_parts(parameters(m, grid.tp, grid.pp, tp_rank, pp_rank), grid.dp, 1, bucket_size(p, grid.dp))


@lru_cache(maxsize=256)
def _saved_parts_index(m: ModelShape, p: Parallelism, world: int, tp_rank: int, pp_rank: int
                       ) -> dict[str, tuple[list[int], list[Piece]]]:
    """A position's saved optimizer parts by name, each name's in order of their first
    element (and the firsts apart, to bisect): a rank finds the parts overlapping its
    own in O(log parts), not by walking every rank's."""
    by_name: dict[str, list[Piece]] = {}
    for part in (y for d in _position_parts(m, p, world, tp_rank, pp_rank) for y in d):
        by_name.setdefault(part.name, []).append(part)
    out = {}
    for name, parts in by_name.items():
        parts.sort(key=lambda y: y.first)
        out[name] = ([y.first for y in parts], parts)
    return out


@lru_cache(maxsize=8192)
def _framework_reads(layout: Megatron, m: ModelShape, p: Parallelism, job: LoadJob,
                     rank: int) -> tuple[ReadRange, ...]:
    """The fully parallel load's reads on `rank` (before the exchange): .metadata,
    then every weight its model-parallel position holds (norms from tensor-parallel
    rank 0's group), then the optimizer parts overlapping its own flat range,
    each saved item whole (DCP's reader narrows it in memory), adjacent items of
    a file as one range. At another world size the same, from where the save
    put them."""
    grid = _grid(p, job.ranks)
    tp_rank, dp_rank, pp_rank = grid.position(rank)
    where = _where(layout, m, p, job.saved_ranks)
    files = {}
    params = parameters(m, grid.tp, grid.pp, tp_rank, pp_rank)
    at = lambda x: (pp_rank, 0 if x.tp_shared else tp_rank, x.name)  # noqa: E731 - where a piece was saved
    wanted = [(pp_rank, 0 if shared else tp_rank, x.name, x.first) for name, n, shared in params
              for x in _weight_chunks(name, n, 1, shared)]
    # this rank's optimizer range at the loading world size, against the parts saved
    saved = _saved_parts_index(m, p, job.saved_ranks, tp_rank, pp_rank)
    for x in _position_parts(m, p, job.ranks, tp_rank, pp_rank)[dp_rank]:
        firsts, parts = saved[x.name]
        i = max(0, bisect.bisect_right(firsts, x.first) - 1)
        while i < len(parts) and parts[i].first < x.first + x.elements:
            if x.first < parts[i].first + parts[i].elements:
                wanted.append((*at(parts[i]), parts[i].first))
            i += 1
    ranges: tuple[list[ReadRange], list[ReadRange]] = ([], [])
    for key in dict.fromkeys(wanted):
        writer, offset, size = where[key]
        name = f"__{writer}_0.distcp"
        if name not in files:
            files[name] = layout.saved(m, p, job, writer).files[0].size
        ranges[key[2].startswith("optimizer.")].append(ReadRange(name, offset, size, writer, files[name]))
    # weights and optimizer parts coalesced apart: a rank's own weights are the same
    # ranges its data-parallel peers read (shared), its optimizer parts its own
    return tuple(layout.metadata_reads(m, p, job) + [r for part in ranges for r in load_plan.coalesce(
        sorted(part, key=lambda r: (r.writer, r.offset)))])


LAYOUT = Megatron()
