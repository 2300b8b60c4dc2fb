"""Published weights as Hugging Face writes them: safetensors shards and their index.

A LLaMA model's tensors, named and shaped as transformers' LlamaForCausalLM
names them, in its state dict's order, split into shards of at most
max_shard_size as huggingface_hub's split_state_dict_into_shards_factory
splits them (a tensor larger than the limit alone in a shard of its own,
appended when met), each shard a safetensors file: an 8-byte little-endian
header length, the JSON header (names, dtypes, shapes, data offsets;
padded with spaces to a multiple of 8 as the safetensors library pads it),
then the tensors' bytes sorted by name as the library lays them out. With
more than one shard, `model.safetensors.index.json` (total size and each
tensor's shard, keys sorted, as transformers writes it) is written last.
Pure arithmetic: the headers and the index are the only bytes not generated.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from functools import lru_cache

from dlio_ckpt_ext.errors import ConfigError

#: safetensors' dtype names for our datatypes
DTYPES = {"fp16": "F16", "float16": "F16", "bf16": "BF16", "bfloat16": "BF16", "fp32": "F32", "float32": "F32",
          "fp64": "F64", "float64": "F64", "int8": "I8", "uint8": "U8"}
DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1}
INDEX = "model.safetensors.index.json"
#: Hugging Face's default max_shard_size ("5GB": decimal, as huggingface_hub parses it)
DEFAULT_MAX_SHARD = 5 * 10**9
_SIZE = re.compile(r"^\s*(\d+)\s*(|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_shard_size(key: str, value: object) -> int:
    """Bytes from '5GB' (decimal, as huggingface_hub reads it), '4GiB' or a byte count."""
    m = _SIZE.match(str(value))
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(key, value, "a positive size such as '5GB' (Hugging Face's default, decimal) or '4GiB'")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    #: how tensor parallelism splits it in vLLM: "column" (dim 0: a row range),
    #: "row" (dim 1: a column block of every row) or "replicated"
    split: str
    #: its pipeline position as plan.layer_range numbers them: 0 the embedding,
    #: 1..L the layers, L+1 the lm_head, L+2 the final norm
    position: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def hf_tensors(num_layers: int, hidden: int, ffn: int, vocab: int, heads: int, kv_heads: int) -> list[Tensor]:
    """LlamaForCausalLM's parameters in its state dict's order (modules in
    registration order: attention, MLP, then the two norms of a layer)."""
    h, dkv = hidden, hidden // heads * kv_heads
    out = [Tensor("model.embed_tokens.weight", (vocab, h), "column", 0)]
    for i in range(num_layers):
        p, pos = f"model.layers.{i}.", i + 1
        out += [Tensor(p + "self_attn.q_proj.weight", (h, h), "column", pos),
                Tensor(p + "self_attn.k_proj.weight", (dkv, h), "column", pos),
                Tensor(p + "self_attn.v_proj.weight", (dkv, h), "column", pos),
                Tensor(p + "self_attn.o_proj.weight", (h, h), "row", pos),
                Tensor(p + "mlp.gate_proj.weight", (ffn, h), "column", pos),
                Tensor(p + "mlp.up_proj.weight", (ffn, h), "column", pos),
                Tensor(p + "mlp.down_proj.weight", (h, ffn), "row", pos),
                Tensor(p + "input_layernorm.weight", (h,), "replicated", pos),
                Tensor(p + "post_attention_layernorm.weight", (h,), "replicated", pos)]
    out += [Tensor("model.norm.weight", (h,), "replicated", num_layers + 2),
            Tensor("lm_head.weight", (vocab, h), "column", num_layers + 1)]
    return out


@dataclass(frozen=True)
class Placed:
    """A tensor in its shard: bytes [begin, end) after the shard's header."""
    tensor: Tensor
    begin: int
    end: int


@dataclass(frozen=True)
class Shard:
    name: str
    prefix: bytes                 # the 8-byte length and the JSON header: what precedes the data
    tensors: tuple[Placed, ...]   # in data order

    @property
    def data_start(self) -> int:
        return len(self.prefix)

    @property
    def size(self) -> int:
        return self.data_start + (self.tensors[-1].end if self.tensors else 0)


def _split(tensors: list[Tensor], itemsize: int, max_shard: int) -> list[list[Tensor]]:
    """huggingface_hub's split: a tensor above the limit gets a shard of its
    own (appended when met), else a new shard starts when the next tensor
    would pass the limit."""
    shards, current, size = [], [], 0
    for t in tensors:
        n = t.elements * itemsize
        if n > max_shard:
            shards.append([t])
            continue
        if size + n > max_shard:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += n
    if current:
        shards.append(current)
    return shards


def _prefix(placed: list[Placed], dtype: str) -> bytes:
    header = {"__metadata__": {"format": "pt"}}
    for p in placed:
        header[p.tensor.name] = {"dtype": dtype, "shape": list(p.tensor.shape), "data_offsets": [p.begin, p.end]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


@lru_cache(maxsize=64)
def shards(num_layers: int, hidden: int, ffn: int, vocab: int, heads: int, kv_heads: int, datatype: str,
           max_shard: int) -> tuple[Shard, ...]:
    """The published shards, in file order."""
    dtype = DTYPES[datatype]
    itemsize = DTYPE_BYTES[dtype]
    groups = _split(hf_tensors(num_layers, hidden, ffn, vocab, heads, kv_heads), itemsize, max_shard)
    out = []
    for i, group in enumerate(groups):
        name = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        placed, at = [], 0
        for t in sorted(group, key=lambda t: t.name):  # the safetensors library sorts by (dtype, name)
            placed.append(Placed(t, at, at + t.elements * itemsize))
            at += t.elements * itemsize
        out.append(Shard(name, _prefix(placed, dtype), tuple(placed)))
    return tuple(out)


def index(published: tuple[Shard, ...]) -> bytes:
    """model.safetensors.index.json as transformers writes it (sorted keys, indent 2)."""
    total = sum(p.end - p.begin for s in published for p in s.tensors)
    weight_map = {p.tensor.name: s.name for s in published for p in s.tensors}
    parameters = sum(t.tensor.elements for s in published for t in s.tensors)
    return (json.dumps({"metadata": {"total_parameters": parameters, "total_size": total}, "weight_map": weight_map},
                       indent=2, sort_keys=True) + "\n").encode()
