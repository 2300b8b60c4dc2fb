"""DeepSpeed's universal checkpoint, as `ds_to_universal.py` makes it and
`load_universal` reads it (deepspeed/checkpoint/ds_to_universal.py and
universal_checkpoint.py, read 2026-12): the arithmetic only.

A ZeRO checkpoint loads only at the data-parallel size it was saved at
(`_load_zero_checkpoint`: "not currently supported"). Its users convert it:

1. extract: every `*_optim_states.pt` read whole (torch.load), and each
   parameter's fragment of it written as its own file,
   `tmp/<param>/<tp>/<state>.<dp:02d>` (fp32, exp_avg, exp_avg_sq and step);
2. merge: each parameter's fragments read and written whole,
   `zero/<param>/<state>.pt`, one folder a parameter;
3. `zero/optimizer_state.pt` (param_groups, from the first optimizer file,
   read again), the `*_model_states.pt` copied, `tmp/` removed, and
   `latest_universal` at the save root naming the new folder.

The universal load then lists each parameter's folder and reads every file
in it whole (load_hp_checkpoint_state), keeping its slice: under ZeRO-3
every parameter of the rank's model-parallel position, under ZeRO-1/2 those
overlapping its new flat partition.

The parameters are upstream DLIO's (deepspeed.layer_elements): per layer a
fused QKV, the attention output, fused gate/up, down and two norms; the
embedding and lm_head split over tensor parallelism with the matrices,
norms whole on every TP rank. A ZeRO-1/2 partition is the data-parallel
rank's share of its position's flat buffer; ZeRO-3 partitions each
parameter (ceil(numel / dp) a rank, the last short).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, ShardFile

#: the optimizer's states a parameter's folder holds besides its step (Adam's)
STATES = ("fp32", "exp_avg", "exp_avg_sq")
STEP = "step"
#: a tensor written by torch.save: its bytes and a zip around them this much larger (torch 2.14.1,
#: as layouts/dcp.py measured it); step is a 0-dim tensor
SAVE_OVERHEAD = 1577
STEP_BYTES = 4 + SAVE_OVERHEAD
#: zero/optimizer_state.pt: the optimizer's param_groups and ZeRO's bookkeeping, no tensors
OPTIMIZER_STATE_BYTES = 2048
TMP, ZERO = "tmp", "zero"
#: the save root's pointer to the newest universal folder
LATEST_UNIVERSAL = "latest_universal"


@dataclass(frozen=True)
class Param:
    name: str
    numel: int          # on one tensor-parallel rank
    split: bool         # split over tensor parallelism (a norm is whole on every TP rank)
    position: int       # plan.layer_range's pipeline position


def universal_dir(directory: str) -> str:
    """Where the conversion of checkpoint folder `directory` goes (beside it)."""
    return f"{directory}_universal"


@lru_cache(maxsize=64)
def params(m: ModelShape, tp: int) -> tuple[Param, ...]:
    """Every parameter, in the order of the flat buffers (position, then layer order)."""
    h, f, v = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    out = [Param("word_embeddings.weight", v * h // tp, True, 0)]
    for i in range(1, m.num_layers + 1):
        pre = f"layers.{i - 1}."
        out += [Param(pre + "input_layernorm.weight", h, False, i),
                Param(pre + "self_attention.query_key_value.weight", h * (h + 2 * dkv) // tp, True, i),
                Param(pre + "self_attention.dense.weight", h * h // tp, True, i),
                Param(pre + "post_attention_layernorm.weight", h, False, i),
                Param(pre + "mlp.dense_h_to_4h.weight", 2 * h * f // tp, True, i),
                Param(pre + "mlp.dense_4h_to_h.weight", h * f // tp, True, i)]
    out += [Param("lm_head.weight", v * h // tp, True, m.num_layers + 1),
            Param("final_layernorm.weight", h, False, m.num_layers + 2)]
    return tuple(out)


def stage_params(m: ModelShape, p: Parallelism, pp_rank: int) -> tuple[Param, ...]:
    start, end = plan.layer_range(pp_rank, p.pipeline, m.num_layers)
    return tuple(x for x in params(m, p.tensor) if start <= x.position <= end)


@lru_cache(maxsize=4096)
def fragments(m: ModelShape, p: Parallelism, dp: int, pp_rank: int, dp_rank: int) -> tuple[tuple[Param, int], ...]:
    """(parameter, elements) of data-parallel rank dp_rank's partition at pipeline
    stage pp_rank, as ds_to_universal extracts it (ZeRO-1/2: the parameters its
    share of the flat buffer overlaps; ZeRO-3: every parameter, its share
    padding-free, empty ones too)."""
    mine = stage_params(m, p, pp_rank)
    if p.zero_stage == 3:
        out = []
        for x in mine:
            part = -(-x.numel // dp)
            out.append((x, max(0, min(part, x.numel - dp_rank * part))))
        return tuple(out)
    total = sum(x.numel for x in mine)
    part = -(-total // dp)
    lo, hi = dp_rank * part, min(total, (dp_rank + 1) * part)
    out, offset = [], 0
    for x in mine:
        a, b = max(lo, offset), min(hi, offset + x.numel)
        if b > a:
            out.append((x, b - a))
        offset += x.numel
    return tuple(out)


def state_bytes(m: ModelShape, elements: int) -> int:
    return elements * plan.dtype_bytes("model.optimizer_datatype", m.optimizer_datatype) + SAVE_OVERHEAD


def fragment_files(m: ModelShape, p: Parallelism, dp: int, tp_rank: int, pp_rank: int,
                   dp_rank: int) -> tuple[ShardFile, ...]:
    """The files the extraction of one optimizer file writes, below the universal folder."""
    out = []
    for x, n in fragments(m, p, dp, pp_rank, dp_rank):
        base = f"{TMP}/{x.name}/{tp_rank}"
        out += [ShardFile(f"{base}/{s}.{dp_rank:02d}", state_bytes(m, n), "optimizer") for s in STATES]
        out.append(ShardFile(f"{base}/{STEP}.{dp_rank:02d}", STEP_BYTES, "metadata"))
    return tuple(out)


def whole_numel(x: Param, tp: int) -> int:
    return x.numel * tp if x.split else x.numel


def merged_files(m: ModelShape, p: Parallelism, x: Param) -> tuple[ShardFile, ...]:
    """zero/<param>/: each state whole (every TP slice merged), and its step."""
    base = f"{ZERO}/{x.name}"
    return tuple(ShardFile(f"{base}/{s}.pt", state_bytes(m, whole_numel(x, p.tensor)), "optimizer")
                 for s in STATES) + (ShardFile(f"{base}/{STEP}.pt", STEP_BYTES, "metadata"),)


def optimizer_state_file() -> ShardFile:
    return ShardFile(f"{ZERO}/optimizer_state.pt", OPTIMIZER_STATE_BYTES, "metadata")


def held(m: ModelShape, p: Parallelism, ranks: int, rank: int) -> tuple[Param, ...]:
    """The parameters whose folders `rank` of a job of `ranks` reads in the
    universal load: under ZeRO-3 every one of its pipeline stage, under
    ZeRO-1/2 those its new partition of its stage's flat buffer overlaps."""
    mp = p.tensor * p.pipeline
    pp_rank, dp = (rank // p.tensor) % p.pipeline, ranks // mp
    return tuple(x for x, n in fragments(m, p, dp, pp_rank, rank // mp) if n or p.zero_stage == 3)


def position_rank(p: Parallelism, tp_rank: int, pp_rank: int, dp_rank: int) -> int:
    """The rank that saved (tp, pp, dp)'s files (the DeepSpeed layout's numbering)."""
    return dp_rank * p.tensor * p.pipeline + pp_rank * p.tensor + tp_rank


def stage_of(m: ModelShape, p: Parallelism, x: Param) -> int:
    return next(s for s in range(p.pipeline) if x in stage_params(m, p, s))


def fragments_of(m: ModelShape, p: Parallelism, saved_ranks: int, x: Param) -> list[tuple[ShardFile, int]]:
    """(fragment file, the saved rank whose optimizer file it came from) of parameter x: what its merge reads."""
    dp, pp_rank = saved_ranks // (p.tensor * p.pipeline), stage_of(m, p, x)
    out = []
    for t in range(p.tensor):
        for d in range(dp):
            if dict((y.name, n) for y, n in fragments(m, p, dp, pp_rank, d)).get(x.name) is None:
                continue
            prefix = f"{TMP}/{x.name}/{t}/"
            out += [(f, position_rank(p, t, pp_rank, d)) for f in fragment_files(m, p, dp, t, pp_rank, d)
                    if f.name.startswith(prefix)]
    return out


def folders(names: Iterable[str]) -> list[str]:
    """The folders files of these names go in, parents first (made before they are written on a file system)."""
    out: dict[str, None] = {}
    for name in names:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out["/".join(parts[:i])] = None
    return list(out)
