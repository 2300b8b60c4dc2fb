"""Published weights as Hugging Face publishes them, loaded by serving replicas
(model loads): `publish-{s}/` holds bf16 safetensors shards of at most
max_shard_size (safetensors_plan: names, headers, the split) and, with more
than one, `model.safetensors.index.json`, written last by rank 0. Shard j is
written by rank j % ranks (an upload split across the ranks). Each load reads
the publish as the chosen loader does: vLLM's default (each rank the pages of
its tensor-parallel slices), runai-model-streamer (whole shards, its own
requests) or fastsafetensors (a replica's ranks split the shards and
broadcast them); docs/model-loads.md has the sources."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Optional

from dlio_ckpt_ext.shared_plans import load_plan, plan, safetensors_plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.shared_plans.load_plan import PAGE, LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan, ShardFile

#: a model load, named after the loader it emulates: vLLM's default (safetensors'
#: mmap: each rank its slices), runai-model-streamer (whole shards), fastsafetensors
#: (a replica's ranks split the shards, read whole files, broadcast)
PATTERNS = ("safetensors", "runai", "fastsafetensors")


#: safetensors 0.8 writes a shard into a temporary file beside it, then renames it
SHARD_TMP = ".tmp"
#: config.json's dtype for a safetensors dtype
TORCH_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8"}
#: the transformers release whose config files model_configs writes
TRANSFORMERS_VERSION = "5.25.0"


def model_configs(m: ModelShape) -> tuple[tuple[str, bytes], ...]:
    """config.json and generation_config.json as save_pretrained writes a
    LlamaForCausalLM's (transformers 5.25.0): what a loader reads before the weights."""
    def text(d: dict) -> bytes:
        return (json.dumps(d, indent=2, sort_keys=True) + "\n").encode()
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 1, "dtype": TORCH_DTYPES[safetensors_plan.DTYPES[m.model_datatype]],
              "eos_token_id": 2, "head_dim": m.hidden_size // m.num_attention_heads, "hidden_act": "silu",
              "hidden_size": m.hidden_size, "initializer_range": 0.02, "intermediate_size": m.ffn_hidden_size,
              "max_position_embeddings": 2048, "mlp_bias": False, "model_type": "llama",
              "num_attention_heads": m.num_attention_heads, "num_hidden_layers": m.num_layers,
              "num_key_value_heads": m.num_kv_heads, "pad_token_id": None, "pretraining_tp": 1,
              "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
              "tie_word_embeddings": False, "transformers_version": TRANSFORMERS_VERSION, "use_cache": True,
              "vocab_size": m.vocab_size}
    generation = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2, "output_attentions": False,
                  "output_hidden_states": False, "transformers_version": TRANSFORMERS_VERSION, "use_cache": True}
    return ("config.json", text(config)), ("generation_config.json", text(generation))


def published_shards(m: ModelShape, p: Parallelism) -> tuple[safetensors_plan.Shard, ...]:
    """The model's weights as Hugging Face publishes them."""
    return safetensors_plan.shards(m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size,
                                   m.num_attention_heads, m.num_kv_heads, m.model_datatype, p.max_shard_size)


def _needed(m: plan.ModelShape, p: plan.Parallelism, rank: int):
    """(shard index, shard, first byte, end byte) in the file of every tensor
    slice `rank` holds when serving: its pipeline stage's tensors, a
    column-parallel one's row range (q/k/v, gate/up, the embedding and
    lm_head), a row-parallel one whole (o_proj, down_proj: a column block of
    every row, and the kernel reads a mapped file around each fault,
    read_ahead_kb = 128 KiB by default, more than one of these rows), a norm
    whole (replicated)."""
    tp_rank, pp_rank = rank % p.tensor, (rank // p.tensor) % p.pipeline
    first, last = plan.layer_range(pp_rank, p.pipeline, m.num_layers)
    for j, shard in enumerate(published_shards(m, p)):
        for placed in shard.tensors:
            t = placed.tensor
            if not first <= t.position <= last:
                continue
            lo, hi = placed.begin, placed.end
            if t.split == "column" and p.tensor > 1:
                rows = t.shape[0]
                row_bytes = (hi - lo) // rows
                per = -(-rows // p.tensor)
                lo, hi = (placed.begin + min(rows, tp_rank * per) * row_bytes,
                          placed.begin + min(rows, (tp_rank + 1) * per) * row_bytes)
            if hi > lo:
                yield j, shard, shard.data_start + lo, shard.data_start + hi


def _model_load_reads(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
    """The index first (every loader reads the weight map), then per pattern
    the pages of the rank's slices, or whole shards."""
    shards = published_shards(m, p)
    writer = lambda j: j % job.saved_ranks  # noqa: E731 - the publish's rank that wrote shard j
    index = [load_plan.whole(f, 0) for f in LAYOUT.saved(m, p, job, 0).commit_files]
    return index + _shard_reads(m, p, job, rank, shards, writer)


def _shard_reads(m, p, job, rank, shards, writer) -> list[ReadRange]:
    if job.pattern == "safetensors":
        # mmap: the pages holding each slice, read in file order; neighbouring pages as one stream
        pages = sorted((j, lo - lo % PAGE, min(shard.size, -(-hi // PAGE) * PAGE))
                       for j, shard, lo, hi in _needed(m, p, rank))
        out: list[ReadRange] = []
        for j, lo, hi in pages:
            last = out[-1] if out else None
            if last and last.name == shards[j].name and lo <= last.offset + last.length:
                end = max(hi, last.offset + last.length)
                out[-1] = ReadRange(last.name, last.offset, end - last.offset, last.writer, last.file_size)
            else:
                out.append(ReadRange(shards[j].name, lo, hi - lo, writer(j), shards[j].size))
        return out
    members = [rank] if job.pattern == "runai" else list(plan.tensor_group(p, rank))
    wanted = sorted({j for r in members for j, _, _, _ in _needed(m, p, r)})
    if job.pattern == "runai":
        # SafetensorsStreamer streams all its files three times: every file's 8-byte header
        # length, then every header, then the tensors (safetensors_pytorch.py, runai-model-streamer 0.17)
        lengths = [ReadRange(shards[j].name, 0, 8, writer(j), shards[j].size) for j in wanted]
        headers = [ReadRange(shards[j].name, 8, shards[j].data_start - 8, writer(j), shards[j].size) for j in wanted]
        return lengths + headers + _runai_data(shards, wanted, writer, job)
    return [ReadRange(shards[j].name, 0, shards[j].size, writer(j), shards[j].size) for j in wanted]


#: runai-model-streamer 0.17's defaults: its ring of buffers, their memory limit (bytes)
#: and its workers per buffer: an object store's, and its file-system sync_buffered
#: reader's (the one our file-system defaults emulate; requests_iterator.py, C++ config.h)
RUNAI_RING_BUFFERS, RUNAI_MEMORY_LIMIT = 18, 40_000_000_000
RUNAI_OBJECT_WORKERS, RUNAI_FILE_WORKERS = 8, 16


def _buffers_needed(sizes: list[int], buffer: int, most: int) -> int:
    """Buffers of `buffer` bytes the tensors fill, whole and in order (more than `most`: most + 1)."""
    used, count = buffer, 0
    for n in sizes:
        if n > buffer:
            return most + 1
        if used + n > buffer:
            count, used = count + 1, 0
            if count > most:
                return count
        used += n
    return count


def runai_buffer_bytes(sizes: list[int]) -> int:
    """The ring's buffer size (requests_iterator.py's sizing): at least the largest tensor
    and the stream's bytes over the ring's 18; below the memory limit, the smallest size
    from there that streams everything in at most 18 buffers, if the limit allows one."""
    total = sum(sizes)
    low = max(max(sizes, default=0), min(RUNAI_MEMORY_LIMIT, total) // RUNAI_RING_BUFFERS)
    high = RUNAI_MEMORY_LIMIT // RUNAI_RING_BUFFERS
    if total >= RUNAI_MEMORY_LIMIT or high < low or \
            _buffers_needed(sizes, high, RUNAI_RING_BUFFERS) > RUNAI_RING_BUFFERS:
        return low
    while low < high:
        middle = (low + high) // 2
        if _buffers_needed(sizes, middle, RUNAI_RING_BUFFERS) > RUNAI_RING_BUFFERS:
            low = middle + 1
        else:
            high = middle
    return low


def _runai_data(shards, wanted: list[int], writer, job: LoadJob) -> list[ReadRange]:
    """The tensors pass: every tensor of the files, in file order, packed whole into the
    ring's buffers (a file may span two); each buffer's bytes of a file are one range,
    and the buffer's bytes are split among its workers in whole read sizes, the first
    taking the rest (C++ Assigner::assign_group): a worker's edge inside a range is a
    cut there, as the streamer ends a request at it."""
    tensors = [(j, t.begin + shards[j].data_start, t.end - t.begin) for j in wanted for t in shards[j].tensors]
    buffer = runai_buffer_bytes([n for _, _, n in tensors])
    submissions: list[list[tuple[int, int, int]]] = [[]]
    used = 0
    for j, at, n in tensors:
        if used + n > buffer and submissions[-1]:
            submissions.append([])
            used = 0
        submissions[-1].append((j, at, n))
        used += n
    out = []
    for sub in submissions:
        spans: list[list[int]] = []  # [file, start, end]: a buffer's bytes of one file, contiguous
        for j, at, n in sub:
            if spans and spans[-1][0] == j and spans[-1][2] == at:
                spans[-1][2] += n
            else:
                spans.append([j, at, at + n])
        total = sum(e - b for _, b, e in spans)
        blocks = total // job.read_size
        workers = max(1, min(blocks, RUNAI_OBJECT_WORKERS if job.object_store else RUNAI_FILE_WORKERS))
        base = blocks // workers * job.read_size
        edges, at = [], base + (total - workers * base)  # worker k's end, in the buffer's bytes
        for _ in range(workers - 1):
            edges.append(at)
            at += base
        seen = 0
        for j, b, e in spans:
            cuts = tuple(b + x - seen for x in edges if seen < x < seen + e - b)
            out.append(ReadRange(shards[j].name, b, e - b, writer(j), shards[j].size, cuts))
            seen += e - b
    return out


def _shard_owner(p: plan.Parallelism, job: LoadJob, rank: int, r: ReadRange, reads: tuple[ReadRange, ...]) -> int:
    """fastsafetensors: the member of the tensor-parallel group that reads file
    r whole for all: the i-th file the group needs goes to its i-th rank, round robin."""
    members = plan.tensor_group(p, rank)
    return members[[x.name for x in reads].index(r.name) % len(members)]


class Safetensors(Layout):
    name = "safetensors"
    committed = True
    model_load = True
    patterns = PATTERNS
    pattern_key = "model_load.pattern"
    framework = "Hugging Face safetensors"
    durability = "no fsync: each shard written to a temporary file and renamed, the index written in place"

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return f"publish-{step}"

    def validate(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        # published weights are the same however they are served: any number of ranks publishes them
        super().validate(m, replace(p, tensor=1, pipeline=1), comm_size)

    def check(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        if m.model_datatype not in safetensors_plan.DTYPES:
            raise ConfigError("model.model_datatype", m.model_datatype, ", ".join(safetensors_plan.DTYPES))
        if p.mode != "default":
            raise ConfigError("checkpoint.mode", p.mode, "default with checkpoint.layout safetensors")

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        """The publish: rank 0's config.json and generation_config.json first,
        shard j written by rank j % ranks (each as a temporary file renamed to
        its name, as safetensors writes it), the index by rank 0 once every
        shard is there."""
        shards = published_shards(m, p)
        configs = tuple(ShardFile(name, len(text), "metadata", text) for name, text in model_configs(m)) \
            if rank == 0 else ()
        files = configs + tuple(ShardFile(s.name, s.size, "weights", s.prefix, tmp_suffix=SHARD_TMP)
                                for j, s in enumerate(shards) if j % world == rank)
        commit = ()
        if rank == 0 and len(shards) > 1:
            text = safetensors_plan.index(shards)
            commit = (ShardFile(safetensors_plan.INDEX, len(text), "index", text),)
        return RankPlan(rank, rank, 0, 0, 0, files, commit)

    def validate_job(self, m: ModelShape, p: Parallelism, job: LoadJob) -> None:
        # published weights are the same at any world size: any loading job reads them
        super().validate_job(m, p, replace(job, saved_ranks=job.ranks) if job.saved_ranks > 0 else job)

    def rank_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> tuple[ReadRange, ...]:
        if not 0 <= rank < job.ranks:
            raise ConfigError("rank", rank, f"0..{job.ranks - 1}")
        return tuple(_model_load_reads(m, p, job, rank))

    def range_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange,
                      rank: int = 0) -> tuple[int, ...]:
        # fastsafetensors shares within a serving replica; the other loaders share nothing
        return tuple(plan.tensor_group(p, rank)) if job.pattern == "fastsafetensors" else (rank,)

    def shares(self, job: LoadJob, share: str) -> bool:
        return share == "broadcast" or job.pattern == "fastsafetensors"

    def read_owner(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int, r: ReadRange,
                   reads: tuple[ReadRange, ...]) -> Optional[int]:
        return _shard_owner(p, job, rank, r, reads) if job.pattern == "fastsafetensors" else None

    def owner_reads(self, job: LoadJob) -> bool:
        return job.pattern == "fastsafetensors"

    def storage_group(self, p: Parallelism, rank: int) -> Optional[int]:
        return plan.tensor_group(p, rank)[0]


LAYOUT = Safetensors()
