"""Shard plan: model shape + parallelism + MPI size -> the files each rank owns.

Two layouts. "deepspeed" reproduces upstream DLIO's transformer sizing, so a
run of ours writes exactly the bytes an upstream DLIO run would, with the
file names DeepSpeed uses. "dcp" is what torch.distributed.checkpoint writes
for an FSDP-sharded model (torchtitan): one `__{rank}_0.distcp` per rank and
a `.metadata` that rank 0 writes once every rank has finished (DCP's commit).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from dlio_ckpt_ext import safetensors_plan
from dlio_ckpt_ext.errors import ConfigError

DTYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "float16": 2,
               "bfloat16": 2, "fp32": 4, "float32": 4, "fp64": 8, "float64": 8}
MODES = ("default", "subset")
LAYOUTS = ("deepspeed", "dcp", "safetensors")
#: layouts whose last file (DCP's .metadata, the safetensors index) rank 0 writes once every rank is done
COMMITTED_LAYOUTS = ("dcp", "safetensors")
#: bytes of DCP's .metadata per (tensor, state entry, rank): an approximation of the
#: pickled chunk and storage records (offset, length, path, shape) DCP keeps for each
DCP_METADATA_ENTRY_BYTES = 200
#: what DCP saves per parameter for Adam: the parameter and its two moments
DCP_STATE_ENTRIES = 3
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    model_datatype: str = "fp16"
    optimizer_datatype: str = "fp32"


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1
    zero_stage: int = 0
    data: int | None = None  # required in subset mode
    mode: str = "default"
    layout: str = "deepspeed"
    #: safetensors: the largest shard (Hugging Face's max_shard_size)
    max_shard_size: int = safetensors_plan.DEFAULT_MAX_SHARD


@dataclass(frozen=True)
class ShardFile:
    """One file of one checkpoint, relative to the checkpoint directory."""
    name: str
    size: int
    kind: str  # "model", "optimizer", "state" (DCP: both), "metadata", "weights" or "index" (safetensors)
    #: bytes the file starts with, not generated: a safetensors header, the index (all of it)
    prefix: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class RankPlan:
    rank: int
    dp_rank: int
    mp_rank: int
    pp_rank: int
    tp_rank: int
    files: tuple[ShardFile, ...]
    #: written by this rank only after every rank has finished its files (DCP's .metadata)
    commit_files: tuple[ShardFile, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files + self.commit_files)


def _dtype_bytes(key: str, name: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ConfigError(key, name, ", ".join(sorted(DTYPE_BYTES))) from None


def num_parameters(m: ModelShape) -> int:
    """Total parameter count N of the model (upstream DLIO's formula)."""
    h, f, v = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    per_layer = h + h * (h + 2 * dkv) + h * h + h + 2 * h * f + h * f
    return 2 * v * h + m.num_layers * per_layer + h


def validate(m: ModelShape, p: Parallelism, comm_size: int) -> None:
    """Raise ConfigError for any shape/parallelism/world size we cannot plan."""
    for key, val in (("model.num_layers", m.num_layers), ("model.transformer.hidden_size", m.hidden_size),
                     ("model.transformer.ffn_hidden_size", m.ffn_hidden_size),
                     ("model.transformer.vocab_size", m.vocab_size),
                     ("model.transformer.num_attention_heads", m.num_attention_heads),
                     ("model.transformer.num_kv_heads", m.num_kv_heads),
                     ("model.parallelism.tensor", p.tensor), ("model.parallelism.pipeline", p.pipeline),
                     ("MPI world size", comm_size)):
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ConfigError(key, val, "a positive integer")
    _dtype_bytes("model.model_datatype", m.model_datatype)
    _dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
    # Upstream sizes heads with integer division (the 1T preset's 25872/192
    # is not whole), so only an impossible head count is rejected.
    if m.num_attention_heads > m.hidden_size:
        raise ConfigError("model.transformer.num_attention_heads", m.num_attention_heads,
                          f"at most hidden_size {m.hidden_size}")
    if m.num_kv_heads > m.num_attention_heads:
        raise ConfigError("model.transformer.num_kv_heads", m.num_kv_heads,
                          f"at most num_attention_heads {m.num_attention_heads}")
    # tensor parallelism splits the attention heads: an uneven split is no layout
    # any framework writes (and would size the shards wrongly)
    if m.num_attention_heads % p.tensor or m.num_kv_heads % p.tensor:
        raise ConfigError("model.parallelism.tensor", p.tensor,
                          f"a divisor of both num_attention_heads {m.num_attention_heads} and num_kv_heads "
                          f"{m.num_kv_heads} (tensor parallelism splits the heads)")
    if p.zero_stage not in ZERO_STAGES:
        raise ConfigError("model.parallelism.zero_stage", p.zero_stage, "0, 1, 2 or 3")
    if p.mode not in MODES:
        raise ConfigError("checkpoint.mode", p.mode, " or ".join(MODES))
    if p.layout not in LAYOUTS:
        raise ConfigError("checkpoint.layout", p.layout, " or ".join(LAYOUTS))
    if p.layout == "safetensors":
        if m.model_datatype not in safetensors_plan.DTYPES:
            raise ConfigError("model.model_datatype", m.model_datatype, ", ".join(safetensors_plan.DTYPES))
        if p.mode != "default":
            raise ConfigError("checkpoint.mode", p.mode, "default with checkpoint.layout safetensors")
    if p.layout == "dcp":
        for key, val in (("model.parallelism.tensor", p.tensor), ("model.parallelism.pipeline", p.pipeline)):
            if val != 1:
                raise ConfigError(key, val, "1 with checkpoint.layout dcp (FSDP shards every tensor "
                                            "across all ranks; tensor/pipeline layouts are not planned)")
    if p.pipeline > m.num_layers:
        raise ConfigError("model.parallelism.pipeline", p.pipeline,
                          f"at most num_layers {m.num_layers}")
    if p.zero_stage == 3 and p.pipeline > 1:
        raise ConfigError("model.parallelism.pipeline", p.pipeline,
                          "1 with zero_stage 3 (ZeRO-3 shards the model across data-parallel ranks, "
                          "not pipeline stages)")
    mp = p.tensor * p.pipeline
    if p.mode == "subset":
        if p.data is None or p.data <= 0:
            raise ConfigError("model.parallelism.data", p.data,
                              "a positive integer when checkpoint.mode is subset")
        if comm_size > p.data * mp:
            raise ConfigError("MPI world size", comm_size,
                              f"at most data*tensor*pipeline = {p.data * mp} in subset mode")
    elif comm_size % mp:
        raise ConfigError("MPI world size", comm_size,
                          f"a multiple of tensor*pipeline = {mp} "
                          f"(tensor={p.tensor}, pipeline={p.pipeline})")


def layer_range(pp_rank: int, pp: int, num_layers: int) -> tuple[int, int]:
    """Inclusive layer indices of a pipeline stage: 0 is the embedding,
    1..L the transformer layers, L+1 the lm_head and L+2 the final norm."""
    per, rem = divmod(num_layers, pp)
    if pp_rank < rem:
        start = pp_rank * (per + 1) + 1
        end = start + per
    else:
        start = rem * (per + 1) + (pp_rank - rem) * per + 1
        end = start + per - 1
    if pp_rank == pp - 1:
        end = num_layers + 2
    if pp_rank == 0:
        start = 0
    return start, end


def _layer_elements(m: ModelShape, layer: int, tp: int, shard: int) -> int:
    h, f = m.hidden_size, m.ffn_hidden_size
    if layer in (0, m.num_layers + 1):  # embedding, lm_head
        return h * m.vocab_size // tp // shard
    if layer == m.num_layers + 2:  # final norm
        return h // shard
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    return (h // shard + h * (h + 2 * dkv) // tp // shard + h * h // tp // shard
            + h // shard + 2 * h * f // tp // shard + h * f // tp // shard)


def dcp_tensors(m: ModelShape) -> list[tuple[int, int]]:
    """(rows, columns) of every parameter tensor of a LLaMA-style model, as
    torchtitan names them: tok_embeddings, per layer attention_norm, wq, wk,
    wv, wo, ffn_norm, w1, w3, w2, then norm and output. Their elements add up
    to num_parameters()."""
    h, f = m.hidden_size, m.ffn_hidden_size
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    layer = [(h, 1), (h, h), (dkv, h), (dkv, h), (h, h), (h, 1), (f, h), (f, h), (h, f)]
    return [(m.vocab_size, h)] + layer * m.num_layers + [(h, 1), (m.vocab_size, h)]


def fsdp_rows(rows: int, world: int, rank: int) -> int:
    """Rows of a tensor's dim 0 that `rank` holds under FSDP: torch.chunk's
    split, ceil(rows / world) per rank in rank order, the last ranks short or
    empty. DCP's default planner saves each rank's local shard as it is."""
    per = -(-rows // world)
    return max(0, min(per, rows - rank * per))


def dcp_bytes_per_parameter(m: ModelShape) -> int:
    """Parameter plus Adam's two moments, no separate master copy (torchtitan
    trains in fp32 with mixed precision only in compute): 4 + 2 x 4 = 12 for fp32."""
    return (_dtype_bytes("model.model_datatype", m.model_datatype)
            + 2 * _dtype_bytes("model.optimizer_datatype", m.optimizer_datatype))


def _dcp_plan(m: ModelShape, p: Parallelism, comm_size: int, rank: int) -> RankPlan:
    world = p.data if p.mode == "subset" else comm_size
    tensors = dcp_tensors(m)
    elements = sum(fsdp_rows(rows, world, rank) * cols for rows, cols in tensors)
    files = (ShardFile(f"__{rank}_0.distcp", elements * dcp_bytes_per_parameter(m), "state"),)
    commit = ()
    if rank == 0:
        commit = (ShardFile(".metadata", DCP_METADATA_ENTRY_BYTES * DCP_STATE_ENTRIES * len(tensors) * world,
                            "metadata"),)
    return RankPlan(rank, rank, 0, 0, 0, files, commit)


def published_shards(m: ModelShape, p: Parallelism) -> tuple[safetensors_plan.Shard, ...]:
    """safetensors: the model's weights as Hugging Face publishes them."""
    return safetensors_plan.shards(m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size,
                                   m.num_attention_heads, m.num_kv_heads, m.model_datatype, p.max_shard_size)


def _safetensors_plan(m: ModelShape, p: Parallelism, comm_size: int, rank: int) -> RankPlan:
    """The publish: shard j written by rank j % ranks (an upload split across
    the ranks), the index by rank 0 once every shard is there."""
    shards = published_shards(m, p)
    files = tuple(ShardFile(s.name, s.size, "weights", s.prefix) for j, s in enumerate(shards) if j % comm_size == rank)
    commit = ()
    if rank == 0 and len(shards) > 1:
        text = safetensors_plan.index(shards)
        commit = (ShardFile(safetensors_plan.INDEX, len(text), "index", text),)
    return RankPlan(rank, rank, 0, 0, 0, files, commit)


def rank_plan(m: ModelShape, p: Parallelism, comm_size: int, rank: int) -> RankPlan:
    """The files `rank` writes in one checkpoint, with exact byte sizes."""
    # published weights are the same however they are served: any number of ranks publishes them
    validate(m, replace(p, tensor=1, pipeline=1) if p.layout == "safetensors" else p, comm_size)
    if not 0 <= rank < comm_size:
        raise ConfigError("rank", rank, f"0..{comm_size - 1}")
    if p.layout == "dcp":
        return _dcp_plan(m, p, comm_size, rank)
    if p.layout == "safetensors":
        return _safetensors_plan(m, p, comm_size, rank)
    tp, pp = p.tensor, p.pipeline
    mp = tp * pp
    dp = p.data if p.mode == "subset" else comm_size // mp
    pp_rank, tp_rank = (rank // tp) % pp, rank % tp
    dp_rank, mp_rank = rank // mp, rank % mp
    mbytes = _dtype_bytes("model.model_datatype", m.model_datatype)
    obytes = _dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
    shard = dp if p.zero_stage == 3 else 1
    prefix = f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}"

    files: list[ShardFile] = []
    # Without ZeRO only the first data-parallel replica checkpoints anything.
    if p.zero_stage == 0 and rank >= mp:
        return RankPlan(rank, dp_rank, mp_rank, pp_rank, tp_rank, ())
    start, end = layer_range(pp_rank, pp, m.num_layers)
    layers = range(start, end + 1)
    if p.zero_stage in (1, 2):
        if dp_rank == 0:
            if pp > 1:
                files += [ShardFile(f"layer_{i:02d}-model_{mp_rank:02d}-model_states.pt",
                                    _layer_elements(m, i, tp, 1) * mbytes, "model") for i in layers]
            else:
                size = sum(_layer_elements(m, i, tp, 1) for i in layers) * mbytes
                files.append(ShardFile(f"mp_rank_{mp_rank:02d}_model_states.pt", size, "model"))
    else:
        size = sum(_layer_elements(m, i, tp, shard) for i in layers) * mbytes
        files.append(ShardFile(f"{prefix}_model_states.pt", size, "model"))

    n = num_parameters(m) // (dp * mp if p.zero_stage > 0 else mp)
    if n > 0:
        # Adam: parameters, momentum, variance, each with 5*h of bookkeeping.
        files.append(ShardFile(f"{prefix}_optim_states.pt", (3 * n + 15 * m.hidden_size) * obytes,
                               "optimizer"))
    return RankPlan(rank, dp_rank, mp_rank, pp_rank, tp_rank, tuple(files))


def checkpoint_bytes(m: ModelShape, p: Parallelism, comm_size: int) -> int:
    """Bytes of one whole checkpoint, all ranks together."""
    return sum(rank_plan(m, p, comm_size, r).total_bytes for r in range(comm_size))


def checkpoint_dir(step: int, epoch: int = 1, layout: str = "deepspeed") -> str:
    """Directory of one checkpoint: as DeepSpeed and upstream DLIO name it, or
    as torchtitan does for DCP."""
    if layout == "safetensors":
        return f"publish-{step}"
    return f"step-{step}" if layout == "dcp" else f"global_epoch{epoch}_step{step}"
