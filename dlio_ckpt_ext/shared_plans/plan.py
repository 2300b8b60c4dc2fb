"""The arithmetic every layout's save plan shares: the model's shape and
parallelism, its tensors, the pipeline stages and data-parallel shards, and
what a plan is made of (a rank's files with their exact sizes). Each layout
(dlio_ckpt_ext.layouts) turns these into the files its framework writes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlio_ckpt_ext.shared_plans import safetensors_plan
from dlio_ckpt_ext.errors import ConfigError

DTYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "float16": 2,
               "bfloat16": 2, "fp32": 4, "float32": 4, "fp64": 8, "float64": 8}
MODES = ("default", "subset")
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
    #: checkpoint.layout: the registry's name of the layout (dlio_ckpt_ext.layouts)
    layout: str = "deepspeed"
    #: safetensors: the largest shard (Hugging Face's max_shard_size)
    max_shard_size: int = safetensors_plan.DEFAULT_MAX_SHARD
    #: orbax: replicas of the FSDP-sharded state (MaxText's data-parallel slices)
    replicas: int = 1
    #: deepspeed: DeepSpeed's own files (checkpoint.deepspeed_files=deepspeed), not upstream DLIO's
    framework_files: bool = False
    #: orbax: devices a rank (a JAX process) drives and saves the shards of
    devices: int = 1
    #: orbax: replica-parallel save (off on GPUs: checkpoint.platform=gpu)
    replica_parallel: bool = True
    #: megatron: --overlap-grad-reduce, the distributed optimizer's state saved a DDP bucket at a time
    overlap_grad_reduce: bool = True


@dataclass(frozen=True)
class ShardFile:
    """One file of one checkpoint, relative to the checkpoint directory."""
    name: str
    size: int
    kind: str  # "model", "optimizer", "state" (both), "metadata", "weights" or "index" (safetensors)
    #: bytes the file starts with, not generated: a safetensors header, the index (all of it)
    prefix: bytes = field(default=b"", repr=False)
    #: written as name + tmp_suffix, then renamed to name, on storage with directories
    #: (DCP's `.metadata.tmp`); "": written in place
    tmp_suffix: str = ""


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
    def all_files(self) -> tuple[ShardFile, ...]:
        return self.files + self.commit_files

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.all_files)


def dtype_bytes(key: str, name: str) -> int:
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
    """Raise ConfigError for any shape/parallelism/world size no layout can plan
    (each layout adds its own refusals)."""
    for key, val in (("model.num_layers", m.num_layers), ("model.transformer.hidden_size", m.hidden_size),
                     ("model.transformer.ffn_hidden_size", m.ffn_hidden_size),
                     ("model.transformer.vocab_size", m.vocab_size),
                     ("model.transformer.num_attention_heads", m.num_attention_heads),
                     ("model.transformer.num_kv_heads", m.num_kv_heads),
                     ("model.parallelism.tensor", p.tensor), ("model.parallelism.pipeline", p.pipeline),
                     ("MPI world size", comm_size)):
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ConfigError(key, val, "a positive integer")
    dtype_bytes("model.model_datatype", m.model_datatype)
    dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
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


def replica(p: Parallelism, rank: int) -> range:
    """The ranks of `rank`'s model replica: its tensor x pipeline group."""
    mp = p.tensor * p.pipeline
    first = rank - rank % mp
    return range(first, first + mp)


def tensor_group(p: Parallelism, rank: int) -> range:
    """The ranks of `rank`'s pipeline stage in its replica: its tensor-parallel group."""
    first = rank - rank % p.tensor
    return range(first, first + p.tensor)
