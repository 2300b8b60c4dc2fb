"""Load plans: the byte ranges each rank of a loading job reads from a saved checkpoint.

A save plan (plan.rank_plan) says which files a rank writes; a load plan says
which (file, offset, length) ranges a rank of the loading job reads, from the
saved checkpoint's layout and world size and the loading job's pattern and
world size. Pure arithmetic, like the save plan, so it can be printed for
1,024 ranks without running anything and checked against a server's request
counters at a few ranks. The frameworks each pattern follows are in
docs/restores.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from dlio_ckpt_ext import plan
from dlio_ckpt_ext.errors import ConfigError

#: own: every rank reads back the files it wrote (DLIO's and MLPerf's definition);
#: framework: what the layout's framework reads on a restore (another world size: resharded)
RESTORE_PATTERNS = ("own", "framework")
#: none: every rank reads all its ranges; broadcast: the ranks reading the same range
#: split it, each reads its part and broadcasts it to the others
SHARE_MODES = ("none", "broadcast")
#: a model load (layout safetensors), named after the loader it emulates: vLLM's default
#: (safetensors' mmap: each rank its slices), runai-model-streamer (whole shards),
#: fastsafetensors (a replica's ranks split the shards, read whole files, broadcast)
MODEL_LOAD_PATTERNS = ("safetensors", "runai", "fastsafetensors")
#: the page a mapped file is read by
PAGE = 4096


@dataclass(frozen=True)
class ReadRange:
    """Bytes [offset, offset + length) of one saved file."""
    name: str        # below the checkpoint directory
    offset: int
    length: int
    writer: int      # the saved rank that wrote the file: whose content it holds
    file_size: int
    #: offsets inside the range where a request must end besides the read_size grid
    #: (a loader's own boundaries: runai-model-streamer's buffers and workers)
    cuts: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, int, int]:
        return self.name, self.offset, self.length


@dataclass(frozen=True)
class LoadJob:
    """The loading job: its pattern, its world size and the saved one."""
    pattern: str = "own"
    ranks: int = 1
    saved_ranks: int = 1
    #: own pattern: rank r reads the files of rank (r + shift) % ranks (recovery_rank_shift)
    shift: int = 0
    #: runai: the read size its requests are cut at, and whether the storage is an object
    #: store (8 workers split each of its buffers there, 16 on a file system)
    read_size: int = 8 << 20
    object_store: bool = False

    @property
    def resharded(self) -> bool:
        return self.saved_ranks != self.ranks


def validate_job(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob) -> None:
    """Raise ConfigError for a load no framework makes (keys as DLIO's config names them)."""
    if p.layout == "safetensors":
        if job.pattern not in MODEL_LOAD_PATTERNS:
            raise ConfigError("model_load.pattern", job.pattern, ", ".join(MODEL_LOAD_PATTERNS))
    elif job.pattern not in RESTORE_PATTERNS:
        raise ConfigError("checkpoint.restore", job.pattern, " or ".join(RESTORE_PATTERNS))
    if isinstance(job.saved_ranks, bool) or not isinstance(job.saved_ranks, int) or job.saved_ranks <= 0:
        raise ConfigError("checkpoint.saved_ranks", job.saved_ranks, "a positive integer (0: this run's ranks)")
    if job.resharded and p.layout != "safetensors":  # published weights are the same at any world size
        if job.pattern == "own":
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              f"this run's {job.ranks} ranks with restore=own (each rank reads the files it "
                              "wrote); a checkpoint saved at another world size is read with restore=framework")
        if p.mode == "subset":
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              "this run's ranks in subset mode (a subset's files are no whole checkpoint to "
                              "reshard)")
        try:
            plan.validate(m, p, job.saved_ranks)
        except ConfigError as exc:
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              f"a world size the layout can be saved at ({exc.key}: {exc.allowed})") from None


def _whole(f: plan.ShardFile, writer: int) -> ReadRange:
    return ReadRange(f.name, 0, f.size, writer, f.size)


def _saved(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> plan.RankPlan:
    return _saved_plan(m, p, job.saved_ranks, rank)


@lru_cache(maxsize=4096)
def _saved_plan(m: plan.ModelShape, p: plan.Parallelism, world: int, rank: int) -> plan.RankPlan:
    return plan.rank_plan(m, p, world, rank)


def _metadata(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob) -> list[ReadRange]:
    """DCP's .metadata, read whole by every rank before its data (DCP's read_metadata)."""
    return [_whole(f, 0) for f in _saved(m, p, job, 0).commit_files]


# -- DCP: FSDP row shards, resharded by overlapping rows ---------------------------------------------
def dcp_items(m: plan.ModelShape, world: int, rank: int) -> list[tuple[int, int, int, int, int]]:
    """The items of rank's `__{rank}_0.distcp` at world size `world`, in file
    order: (tensor index, first row, rows, offset, length). The model's
    parameters first, then the optimizer's two moments of each parameter, as a
    torchtitan state dict lists them ({"model": ..., "optimizer": ...})."""
    mbytes, obytes = (plan.DTYPE_BYTES[m.model_datatype], plan.DTYPE_BYTES[m.optimizer_datatype])
    tensors = plan.dcp_tensors(m)
    items, offset = [], 0
    for dtype_bytes, entries in ((mbytes, 1), (obytes, 2)):
        for t, (rows, cols) in enumerate(tensors):
            mine = plan.fsdp_rows(rows, world, rank)
            if not mine:
                continue
            first = rank * -(-rows // world)
            for _ in range(entries):
                length = mine * cols * dtype_bytes
                items.append((t, first, mine, offset, length))
                offset += length
    return items


_dcp_items_cached = lru_cache(maxsize=4096)(dcp_items)


def _coalesce(ranges: Iterable[ReadRange]) -> list[ReadRange]:
    """Adjacent ranges of one file as one request stream (a file system reads
    them as one sequential stream, s3torchconnector coalesces them into ranged GETs)."""
    out: list[ReadRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if last and last.name == r.name and last.offset + last.length == r.offset:
            out[-1] = ReadRange(r.name, last.offset, last.length + r.length, r.writer, r.file_size)
        else:
            out.append(r)
    return out


def _rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[first, end) rows of a tensor's dim 0 that `rank` holds under FSDP."""
    first = rank * -(-rows // world)
    return first, first + plan.fsdp_rows(rows, world, rank)


def _dcp_resharded(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
    """Every saved item whose rows overlap this rank's new rows, whole (DCP's
    planner asks for the overlap, its reader loads each saved item it touches
    whole and narrows it in memory), in saved rank and file order. Decided per
    distinct tensor shape (a layer's tensors repeat num_layers times): a saved
    file all of whose items are touched is one range, without walking them."""
    new_world, old_world = job.ranks, job.saved_ranks
    shapes = sorted(set(plan.dcp_tensors(m)))
    wanted = {shape: _rows(shape[0], new_world, rank) for shape in shapes}
    candidates = sorted({s for (rows, _), (lo, hi) in wanted.items() if hi > lo
                         for s in range(lo // -(-rows // old_world), (hi - 1) // -(-rows // old_world) + 1)})
    tensors = plan.dcp_tensors(m)
    out: list[ReadRange] = []
    for s in candidates:
        f = _saved(m, p, job, s).files[0]
        held = {shape: _rows(shape[0], old_world, s) for shape in shapes}
        touched = {shape for shape in shapes
                   if held[shape][0] < held[shape][1] and held[shape][0] < wanted[shape][1]
                   and wanted[shape][0] < held[shape][1]}
        if all(shape in touched for shape in shapes if held[shape][0] < held[shape][1]):
            out.append(_whole(f, s))
            continue
        out += _coalesce(ReadRange(f.name, offset, length, s, f.size)
                         for t, _, _, offset, length in _dcp_items_cached(m, old_world, s)
                         if tensors[t] in touched)
    return out


# -- DeepSpeed -------------------------------------------------------------------------------------
def _deepspeed_model_states(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
    """The model-states files DeepSpeed's _load_checkpoint reads on `rank`.
    Without pipeline stages: the sorted glob of its family's model-states files
    (_get_all_ckpt_names) goes to SDLoaderFactory, whose check_ckpt_list loads
    the first, model-parallel rank 0's, whole before load() reads this rank's
    own: two files (the same one twice on model-parallel rank 0). ZeRO-0/1/2:
    the files data-parallel rank 0 wrote, so every replica reads them; ZeRO-3:
    its own data-parallel rank's (at another world size universal loading
    reads data-parallel rank 0's). With pipeline stages every replica loads
    every layer file of its stage (PipelineModule.load_state_dir)."""
    mp = p.tensor * p.pipeline
    mp_rank, dp_rank = rank % mp, rank // mp
    if p.pipeline > 1:
        return [_whole(f, mp_rank) for f in _saved(m, p, job, mp_rank).files if f.kind == "model"]
    dp_writer = dp_rank * mp if p.zero_stage == 3 and not job.resharded else 0
    out = []
    for writer in (dp_writer, dp_writer + mp_rank):
        out += [_whole(f, writer) for f in _saved(m, p, job, writer).files if f.kind == "model"]
    return out


def _deepspeed_optimizer(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
    """The optimizer partitions `rank` reads. At the saved world size its own
    (_get_all_zero_checkpoint_state_dicts loads only the rank's own unless
    elastic_checkpoint is set; ZeRO-0 keeps them with the first replica's
    model states). At another one DeepSpeed refuses every ZeRO checkpoint
    (_load_zero_checkpoint: "not currently supported") but its universal one,
    which we emulate on the saved files, by bytes: ZeRO-3 loads every
    parameter's whole optimizer state on every rank
    (load_hp_checkpoint_state_from_checkpoint_dir_stage3), so a rank reads
    every saved partition; ZeRO-1/2 loads the parameters overlapping its new
    partition whole, so a rank reads the saved partitions of its
    model-parallel rank that overlap its new flat range."""
    mp = p.tensor * p.pipeline
    mp_rank, dp_rank = rank % mp, rank // mp
    if p.zero_stage == 0:
        writers = [mp_rank]
    elif not job.resharded:
        writers = [rank]
    elif p.zero_stage == 3:
        writers = list(range(job.saved_ranks))
    else:
        old_dp, new_dp = job.saved_ranks // mp, job.ranks // mp
        # flat ranges in units of 1 / (old_dp * new_dp) of the model-parallel rank's parameters
        lo, hi = dp_rank * old_dp, (dp_rank + 1) * old_dp
        writers = [d * mp + mp_rank for d in range(old_dp) if d * new_dp < hi and lo < (d + 1) * new_dp]
    return [_whole(f, w) for w in writers for f in _saved(m, p, job, w).files if f.kind == "optimizer"]


# -- model loads: published safetensors shards read by serving replicas ---------------------------
def replica(p: plan.Parallelism, rank: int) -> range:
    """The ranks of `rank`'s serving replica: its tensor x pipeline group."""
    mp = p.tensor * p.pipeline
    first = rank - rank % mp
    return range(first, first + mp)


def tensor_group(p: plan.Parallelism, rank: int) -> range:
    """The ranks of `rank`'s pipeline stage in its replica: its tensor-parallel group."""
    first = rank - rank % p.tensor
    return range(first, first + p.tensor)


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
    for j, shard in enumerate(plan.published_shards(m, p)):
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
    shards = plan.published_shards(m, p)
    writer = lambda j: j % job.saved_ranks  # noqa: E731 - the publish's rank that wrote shard j
    index = [_whole(f, 0) for f in _saved(m, p, job, 0).commit_files]
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
    members = [rank] if job.pattern == "runai" else list(tensor_group(p, rank))
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


def shard_owner(p: plan.Parallelism, job: LoadJob, rank: int, r: ReadRange, reads: tuple[ReadRange, ...]) -> int:
    """fastsafetensors: the member of the tensor-parallel group that reads file
    r whole for all: the i-th file the group needs goes to its i-th rank, round robin."""
    members = tensor_group(p, rank)
    return members[[x.name for x in reads].index(r.name) % len(members)]


def rank_reads(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, rank: int) -> tuple[ReadRange, ...]:
    """The ranges `rank` of the loading job reads, in the order it reads them."""
    if not 0 <= rank < job.ranks:
        raise ConfigError("rank", rank, f"0..{job.ranks - 1}")
    if p.layout == "safetensors":
        return tuple(_model_load_reads(m, p, job, rank))
    if job.pattern == "own":
        src = (rank + job.shift) % job.ranks
        return tuple(_metadata(m, p, job) + [_whole(f, src) for f in _saved(m, p, job, src).files])
    if p.layout == "dcp":
        if not job.resharded:
            return tuple(_metadata(m, p, job) + [_whole(f, rank) for f in _saved(m, p, job, rank).files])
        return tuple(_metadata(m, p, job) + _dcp_resharded(m, p, job, rank))
    return tuple(_deepspeed_model_states(m, p, job, rank) + _deepspeed_optimizer(m, p, job, rank))


def range_readers(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, r: ReadRange,
                  rank: int = 0) -> tuple[int, ...]:
    """Every rank of the loading job whose plan reads exactly range r: the
    group that shares it (share=broadcast). O(the ranks that could read it)."""
    if p.layout == "safetensors":
        # fastsafetensors shares within a serving replica; the other loaders share nothing
        return tuple(tensor_group(p, rank)) if job.pattern == "fastsafetensors" else (rank,)
    if r.name in {f.name for f in _saved(m, p, job, 0).commit_files}:
        return tuple(range(job.ranks))  # DCP's .metadata: every rank, whole
    return tuple(c for c in _candidate_readers(m, p, job, r) if r in rank_reads(m, p, job, c))


def _candidate_readers(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, r: ReadRange) -> Iterable[int]:
    if job.pattern == "own":
        return [(r.writer - job.shift) % job.ranks]
    if p.layout == "dcp":
        if not job.resharded:
            return [r.writer]
        found: set[int] = set()  # the new ranks whose rows meet the saved rank's, in any tensor
        for rows, _ in set(plan.dcp_tensors(m)):
            lo, hi = _rows(rows, job.saved_ranks, r.writer)
            if hi > lo:
                per = -(-rows // job.ranks)
                found.update(range(lo // per, min(job.ranks, (hi - 1) // per + 1)))
        return sorted(found)
    return range(job.ranks)  # DeepSpeed: model-parallel rank 0's model states reach every rank


def saved_files(m: plan.ModelShape, p: plan.Parallelism, saved_ranks: int) -> dict[str, int]:
    """Every file of the saved checkpoint, name -> size."""
    return {f.name: f.size for r in range(saved_ranks)
            for f in _saved_plan(m, p, saved_ranks, r).files + _saved_plan(m, p, saved_ranks, r).commit_files}


def requests(r: ReadRange, read_size: int) -> int:
    """Requests reading r as the engine does: pieces ending at multiples of
    read_size in the file (a range starting between two has a short first one),
    and at its cuts."""
    return _pieces(r.offset, r.length, read_size) + sum(1 for c in r.cuts if c % read_size)


def _pieces(offset: int, length: int, read_size: int) -> int:
    return -(-(offset + length) // read_size) - offset // read_size if length else 0


def _parts(pieces: int, members: int) -> int:
    """Members with a non-empty part when `pieces` requests are split among them (engine.stream.split_range)."""
    if not pieces:
        return 0
    per = -(-pieces // max(1, members))
    return -(-pieces // per)


def sharing(p: plan.Parallelism, job: LoadJob, share: str) -> bool:
    """Whether ranks reading the same range split it and broadcast: asked for,
    or what the loader emulated does (fastsafetensors)."""
    return share == "broadcast" or (p.layout == "safetensors" and job.pattern == "fastsafetensors")


def summary(m: plan.ModelShape, p: plan.Parallelism, job: LoadJob, read_size: int,
            share: str = "none") -> dict:
    """The whole job's load, from the plans alone: bytes and requests per rank,
    readers per file (fan-in: the ranks that get its bytes, and the ranks that
    ask storage for them), bytes read against the checkpoint's size
    (amplification), and with sharing the bytes storage serves and the
    broadcast carries. O(ranks x ranges a rank reads)."""
    files = saved_files(m, p, job.saved_ranks)
    size = sum(files.values())
    shared = sharing(p, job, share)
    owner_reads = p.layout == "safetensors" and job.pattern == "fastsafetensors"
    readers: dict[str, set[int]] = {}
    groups: dict[tuple, set[int]] = {}  # with sharing: (group, range) -> its readers
    per_rank = []
    for rank in range(job.ranks):
        reads = rank_reads(m, p, job, rank)
        for r in reads:
            readers.setdefault(r.name, set()).add(rank)
            if shared:
                group = tensor_group(p, rank)[0] if owner_reads else None
                groups.setdefault((group, r.key), set()).add(rank)
        per_rank.append((rank, sum(r.length for r in reads), sum(requests(r, read_size) for r in reads), reads))
    total = sum(b for _, b, _, _ in per_rank)
    req_by_file: dict[str, int] = {}
    storage_readers: dict[str, int] = {}
    if shared:
        storage = storage_requests = 0
        for (_, (name, offset, length)), ranks in groups.items():
            pieces = _pieces(offset, length, read_size)
            storage += length
            storage_requests += pieces
            req_by_file[name] = req_by_file.get(name, 0) + pieces
            storage_readers[name] = storage_readers.get(name, 0) + (1 if owner_reads else _parts(pieces, len(ranks)))
    else:
        storage, storage_requests = total, sum(q for _, _, q, _ in per_rank)
        for _, _, _, reads in per_rank:
            for r in reads:
                req_by_file[r.name] = req_by_file.get(r.name, 0) + requests(r, read_size)
        storage_readers = {name: len(ranks) for name, ranks in readers.items()}
    fan_in = [len(v) for v in readers.values()] or [0]
    asking = list(storage_readers.values()) or [0]
    rank_bytes = [b for _, b, _, _ in per_rank]
    return {"pattern": job.pattern, "share": "broadcast" if shared else "none", "ranks": job.ranks,
            "saved_ranks": job.saved_ranks, "layout": p.layout, "read_size": read_size,
            "checkpoint_bytes": size, "checkpoint_files": len(files),
            "bytes_read": total, "storage_bytes": storage, "broadcast_bytes": total - storage,
            "amplification": total / size if size else 0.0,
            "storage_amplification": storage / size if size else 0.0,
            "requests": sum(q for _, _, q, _ in per_rank), "storage_requests": storage_requests,
            "files_read": len(readers), "files_unread": len(files) - len(readers),
            "readers_per_file_max": max(fan_in), "readers_per_file_mean": sum(fan_in) / len(fan_in),
            "storage_readers_per_file_max": max(asking), "storage_readers_per_file_mean": sum(asking) / len(asking),
            "requests_per_file_max": max(req_by_file.values(), default=0),
            "requests_per_file_mean": (sum(req_by_file.values()) / len(req_by_file)) if req_by_file else 0.0,
            "rank_bytes_min": min(rank_bytes), "rank_bytes_max": max(rank_bytes),
            "per_rank": [{"rank": rank, "bytes": b, "requests": q, "ranges": len(reads)}
                         for rank, b, q, reads in per_rank]}
