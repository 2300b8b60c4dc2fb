"""Our sections of a DLIO workload config, declared once.

Each option is a dataclass field with its type, default and help text;
OmegaConf rejects unknown keys and values of the wrong type, and
`load_config` adds the range and consistency rules. DLIO's own sections
(framework, workflow, output, ...) are left to DLIO.
"""
from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Optional, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from dlio_ckpt_ext import layouts

from dlio_ckpt_ext.shared_plans import load_plan, plan, safetensors_plan
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.recovery.saved_shape import resume_pattern
from dlio_ckpt_ext.errors import ConfigError

MECHANISM_CLASS = "dlio_ckpt_ext.dlio.mechanism.StreamingCheckpointing"
#: direct_fs is MLCommons' DLIO fork's name for O_DIRECT local I/O; ours does
#: it through the POSIX backend (O_DIRECT both ways, nothing else allowed)
STORAGE_TYPES = ("local_fs", "parallel_fs", "s3", "direct_fs")
ASYNC_MODES = ("disabled", "async")
#: one checkpoint: (step, epoch), the two numbers its directory is named from
CheckpointId = tuple[int, int]
MiB = 1 << 20
#: read requests in flight per rank when streaming.read_parallelism is 0, by storage type
#: (measured: bench/remote_bench.py through an emulated remote link for s3, docs/object-storage.md)
DEFAULT_READ_PARALLELISM = {"s3": 32, "local_fs": 16, "parallel_fs": 16, "direct_fs": 16}
#: files of one checkpoint whose uploads a rank overlaps when streaming.concurrent_files
#: is 0. S3: two, as measured through the emulated remote link (bench/remote_bench.py
#: --ab, docs/object-storage.md): a file's last parts leave the link idle unless the next file starts.
#: >1 needs a storage that lends its write memory (S3 parts), so overlapping files
#: share no buffer pool
#: bytes per buffer when streaming.chunk_size is auto: on S3 the part size (its
#: default 16 MiB: s3dlio allocates each chunk anew, and glibc maps 32 MiB or more
#: fresh each time, a page fault per 4 KiB; bench/cpu_bench.py), elsewhere 32 MiB
DEFAULT_CHUNK_SIZE = {"s3": 16 * MiB, "local_fs": 32 * MiB, "parallel_fs": 32 * MiB, "direct_fs": 32 * MiB}
DEFAULT_CONCURRENT_FILES = {"s3": 2, "local_fs": 1, "parallel_fs": 1, "direct_fs": 1}


@dataclass
class TransformerConfig:
    vocab_size: int = 128256           # embedding and output layer rows
    hidden_size: int = 4096            # model width
    ffn_hidden_size: int = 14336       # MLP width (SwiGLU: three matrices of hidden x ffn)
    num_attention_heads: int = 32      # query heads
    num_kv_heads: int = 8              # key/value heads (grouped-query attention)


@dataclass
class ParallelismConfig:
    tensor: int = 1                    # tensor-parallel degree; divides both head counts
    pipeline: int = 1                  # pipeline-parallel degree (layers split across stages)
    data: Optional[int] = None  # data-parallel degree of the full job; subset mode only
    zero_stage: int = 0                # ZeRO: 0 only the first replica saves; 1-2 optimizer sharded; 3 all
    # megatron: Megatron's --overlap-grad-reduce, which its 8B recipe passes: the distributed
    # optimizer's state in DDP buckets of max(40M, 1M x DP) parameters (docs/fidelity.md)
    overlap_grad_reduce: bool = True


@dataclass
class ModelConfig:
    name: str = "llama3_8b"            # the model's name in the results
    type: str = "transformer"          # the only shape the plan sizes
    num_layers: int = 32               # transformer layers
    model_datatype: str = "fp16"       # parameter datatype: fp16, bf16, fp32, ...
    optimizer_datatype: str = "fp32"   # optimizer state datatype (Adam: master weights + 2 moments)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)


@dataclass
class CheckpointConfig:
    checkpoint_folder: str = "checkpoints"        # below storage.storage_root
    num_checkpoints_write: int = 10    # checkpoints saved (each timed as one window)
    num_checkpoints_read: int = 10     # checkpoints loaded after the saves (0 with no write: an earlier run's)
    time_between_checkpoints: float = 0.0         # seconds of idle before each checkpoint, untimed
    fsync: bool = True                            # fsync each local file before its close counts
    mode: str = "default"                         # default | subset
    layout: str = "deepspeed"                     # deepspeed | dcp | safetensors (docs/layouts.md)
    # deepspeed layout: dlio writes upstream DLIO's names and sizes (MLPerf's CLOSED
    # runs); deepspeed the files a DeepSpeed save itself writes (docs/fidelity.md)
    deepspeed_files: str = "dlio"
    # orbax: devices a rank drives (a JAX process saves all its host's devices' shards
    # into one ocdbt.process_{i}); the platform decides the replica-parallel save (off on gpu)
    devices_per_rank: int = 1
    platform: str = "tpu"                         # tpu | gpu
    # disabled: each save writes to storage before it returns. async: a save
    # stages the rank's state into host memory and returns; a background
    # thread persists it while training goes on (torchtitan's async_mode).
    async_mode: str = "disabled"
    rank_sync: bool = True                        # barrier before each checkpoint
    recovery_rank_shift: bool = False             # read the files of rank (r + ranks_per_node) % size
    # What a load reads (docs/restores.md). own: every rank reads back the files
    # it wrote (DLIO's and MLPerf's definition; CLOSED runs). framework: what the
    # layout's framework reads restoring (DeepSpeed replicas read their
    # model-parallel rank's model states; DCP every rank .metadata, then its data;
    # with saved_ranks another world size, resharded).
    restore: str = "own"                          # own | framework
    saved_ranks: int = 0               # ranks the read checkpoint was saved at; 0 = what the checkpoint says (resume=latest), else this run's
    # broadcast: the ranks reading the same range split it, each reads its part
    # from storage and broadcasts it over MPI in read_size pieces
    share: str = "none"                           # none | broadcast
    # orbax: replicas of the FSDP-sharded state (MaxText's dcn_data_parallelism:
    # slices); each rank shards with world / replicas others (docs/layouts.md)
    replicas: int = 1
    keep_files: bool = True                       # False: delete the checkpoints after the run
    # latest: a load restores the newest whole checkpoint in the folder, found as the
    # layout's framework finds it on restart (docs/recovery.md); "": the steps in turn
    resume: str = ""
    checkpoint_mechanism_classname: str = MECHANISM_CLASS  # the class DLIO loads: this package's
    # DLIO 2.0.0 reads these for its training-loop checkpoints; accepted so a
    # workload can still set them, unused by the checkpoint-only workflow.
    type: str = "rank_zero"                        # DLIO 2.0.0's checkpoint type
    checkpoint_after_epoch: int = 1                # DLIO 2.0.0: first epoch with a checkpoint
    epochs_between_checkpoints: int = 1            # DLIO 2.0.0: epochs between checkpoints
    steps_between_checkpoints: int = -1            # DLIO 2.0.0: steps between checkpoints (-1: per epoch)


@dataclass
class StreamingConfig:
    chunk_size: str = "auto"    # bytes per buffer, a multiple of 1 MiB; auto: S3's part size, else 32MiB
    pool_depth: int = 4         # buffers per rank
    gen_threads: int = 0        # dgen-py threads per rank; 0 = usable CPUs / ranks on this node
    # Reads keep read_parallelism requests of read_size in flight per rank (a
    # read pool of their own): a remote store serves each connection at a
    # capped rate after a round trip, so one request at a time leaves it idle.
    # Defaults chosen by measurement (bench/remote_bench.py, docs/object-storage.md).
    read_size: str = "8MiB"     # bytes per read request; a multiple of 1 MiB
    read_parallelism: int = 0   # read requests in flight per rank; 0 = the storage's default below
    # S3 only: a file is closed once the next concurrent_files - 1 files' bytes
    # were sent, so its last parts upload while they start (a file of few parts
    # cannot fill the upload window alone). 0 = the storage's default (S3: 2).
    concurrent_files: int = 0
    verify: bool = False        # compare every byte read with the regenerated content
    seed: int = 0               # run seed; file seeds are hashed from it
    dedup_ratio: int = 1        # dgen-py: how often each block repeats (1: unique data)
    compress_ratio: int = 1     # dgen-py: how far the data compresses (1: incompressible)
    # incompressible: dgen-py's bytes (CLOSED's). tensors: the top byte of every number
    # narrowed as trained tensors' are, so zstd shrinks a file about as far as a real
    # one of its dtype (docs/fidelity.md); lz4 still finds nothing, as on real tensors
    content: str = "incompressible"
    # every chunk's timings in rank_stats/chunks_NNNNN.json.gz (~220 bytes a
    # chunk before compression: ~5 MB a rank for the 1T preset); off, each
    # file keeps its chunks' count and I/O-rate percentiles
    record_chunks: bool = False
    # seconds without a completed request before a rank says its checkpoint is
    # stalled (and again every as many seconds while it lasts); 0 = never
    stall_warning_s: float = 30


@dataclass
class ModelLoadConfig:
    # checkpoint.layout safetensors: what each rank of a serving replica reads,
    # named after the loader it emulates (docs/model-loads.md). safetensors:
    # vLLM's default loader, each rank its tensor-parallel slices of every
    # tensor its stage needs, page by page; runai: runai-model-streamer, each
    # rank the whole shards it needs; fastsafetensors: a replica's ranks split
    # its shards, each reads whole files and broadcasts them to the others.
    pattern: str = "safetensors"
    max_shard_size: str = "5GB"        # largest shard of the publish (Hugging Face's default; GB decimal)
    read_size: str = "auto"            # bytes per read request; auto: the loader's own (docs/model-loads.md)
    read_parallelism: int = 0          # read requests in flight per rank; 0: the loader's own


@dataclass
class StorageConfig:
    storage_type: str = "local_fs"     # local_fs | parallel_fs | direct_fs (O_DIRECT) | s3 (s3dlio)
    storage_root: str = "./"           # a directory, or s3://bucket, file://dir, direct://dir with s3
    storage_options: dict = field(default_factory=dict)  # checked by the backend


#: the I/O class a persistent save's thread runs at (Megatron's async worker: ionice idle)
PERSISTENT_IO = ("idle", "normal")


@dataclass
class TiersConfig:
    # Two tiers (docs/tiers.md), off unless local_root is set: every checkpoint
    # is saved to local_root as NVIDIA's resiliency extension saves its local
    # checkpoints, every persistent_every-th one also to storage_root in the
    # background, as Megatron-LM's async persistent save.
    local_root: str = ""               # node-local folder (NVMe, a ramdisk); "" = one tier
    persistent_every: int = 5          # K: every K-th checkpoint also goes to the storage under test
    replication: int = 2               # F: ranks' parts each rank keeps locally, its own and F-1 peers'
    replication_jump: int = 0          # ranks between a group's members; 0 = ranks per node (NVRx's default)
    # seconds a persistent save must fit in (the training until the next one); 0 = persistent_every x
    # DLIO's computation between checkpoints: a training workflow's steps_between_checkpoints x
    # train.computation_time, else checkpoint.time_between_checkpoints
    interval_s: float = 0.0
    persistent_nice: int = 10          # the persisting thread's nice, raised to it (Megatron's persistent worker: 10)
    persistent_io: str = "idle"        # idle | normal: its I/O class (Megatron's persistent worker: 3, idle)


@dataclass
class RecoveryConfig:
    # A tiered run's recovery (docs/recovery.md): these ranks stand for replaced nodes,
    # their local folders emptied before the read; their parts come from peers or storage
    lost_ranks: list = field(default_factory=list)


@dataclass
class GoodputConfig:
    # The GOODPUT block (docs/goodput.md): what this run's checkpoint figures cost a training
    # job at its scale and at the nodes named, under this failure model.
    failures_per_node_day: float = 3.8e-3   # Llama 3's pretraining (419 interruptions, 54 days, 2,048 nodes)
    restart_s: float = 0.0             # a restart's time outside storage (scheduler, start-up, compilation); 0: unknown
    interval_s: float = 0.0            # useful work between checkpoints; 0: the run's own (tiers, training loop, idle)
    local_share: float = -1.0          # tiered runs: the share of failures the local tier recovers; -1: 0 and 1 as bounds
    nodes: list = field(default_factory=lambda: [1024, 2048, 16384])  # the scales shown beside the run's own


@dataclass
class WorkloadSections:
    model: ModelConfig = field(default_factory=ModelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    tiers: TiersConfig = field(default_factory=TiersConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    goodput: GoodputConfig = field(default_factory=GoodputConfig)


@dataclass
class RunConfig:
    """The validated settings of one run, plus the shard plan inputs."""
    sections: WorkloadSections
    shape: plan.ModelShape
    parallelism: plan.Parallelism
    chunk_size: int
    read_size: int = 8 * MiB
    #: DLIO's computation between two checkpoints of a training workflow (0: none)
    training_s: float = 0.0
    #: a training workflow: DLIO's training loop decides which checkpoints are saved and names them
    trains: bool = False

    @property
    def read_parallelism(self) -> int:
        """Requests in flight per rank on reads: one when verified content cannot
        be regenerated from an offset (dedup/compress ratios other than 1)."""
        st = self.streaming
        seekable = (st.dedup_ratio, st.compress_ratio) == (1, 1)
        if self.is_model_load:
            chosen = self.model_load.read_parallelism or loader_reads(self.model_load.pattern,
                                                                       self.storage.storage_type)[1]
        else:
            chosen = st.read_parallelism or DEFAULT_READ_PARALLELISM[self.storage.storage_type]
        return chosen if seekable or not st.verify else 1

    @property
    def layout(self) -> Layout:
        """The layout the checkpoints are written in (checkpoint.layout)."""
        return layouts.of(self.parallelism)

    @property
    def is_model_load(self) -> bool:
        """Published weights loaded by serving replicas (a layout whose loads are model loads)."""
        return self.layout.model_load

    def read_step(self, load: int) -> int:
        """The checkpoint the load-th load reads: its own number, but for model
        loads, which load the same published weights again and again: the
        publishes in turn (the one an earlier run made, when this run makes none)."""
        if not self.is_model_load or self.checkpoint.resume:
            return load
        return (load - 1) % (self.checkpoint.num_checkpoints_write or 1) + 1

    def steps_saved(self) -> list[int]:
        """The checkpoints this run saves to the storage under test: every one,
        or with tiers every persistent_every-th (the others stay local). None
        known beforehand in a training run: DLIO's loop asks for each."""
        if self.trains:
            return []
        every = self.tiers.persistent_every if self.has_tiers else 1
        return [s for s in range(1, self.checkpoint.num_checkpoints_write + 1) if s % every == 0]

    def steps_read(self) -> list[int]:
        return sorted({self.read_step(k) for k in range(1, self.checkpoint.num_checkpoints_read + 1)})

    def checkpoints_saved(self) -> list[CheckpointId]:
        """steps_saved as checkpoint ids (a checkpoint-only run's are all of epoch 1)."""
        return [(s, 1) for s in self.steps_saved()]

    def checkpoints_as_loaded(self, listed: list[str]) -> list[str]:
        """The checkpoint folder's entries as a checkpoint loop that reads one
        entry a load counts them (upstream DLIO's and the fork's refuse to read
        more checkpoints than the folder lists): a model load reads its publish
        again and again, so a publish stands once for every load of it, and one
        that is missing not at all."""
        if not self.is_model_load:
            return listed
        present = set(listed)
        loaded = [self.layout.checkpoint_dir(self.read_step(k))
                  for k in range(1, self.checkpoint.num_checkpoints_read + 1)]
        return [name for name in loaded if name in present]

    def load_job(self, comm_size: int, ranks_per_node: int = 0) -> load_plan.LoadJob:
        """What this run's loads read: its pattern (a model load's loader), world
        size and the saved one; ranks_per_node: the shift of recovery_rank_shift."""
        c = self.checkpoint
        pattern = self.model_load.pattern if self.is_model_load else c.restore
        if c.resume:
            pattern = resume_pattern(pattern, c.saved_ranks, comm_size)
        return load_plan.LoadJob(pattern, comm_size, c.saved_ranks or comm_size,
                                 ranks_per_node if c.recovery_rank_shift else 0, self.read_size,
                                 self.storage.storage_type == "s3")

    @property
    def concurrent_files(self) -> int:
        return self.streaming.concurrent_files or DEFAULT_CONCURRENT_FILES[self.storage.storage_type]

    @property
    def is_async(self) -> bool:
        """Saves to the storage under test persist in the background (async mode, or tiers' persistent saves)."""
        return self.checkpoint.async_mode == "async" or self.has_tiers

    @property
    def has_tiers(self) -> bool:
        return bool(self.tiers.local_root)

    @property
    def recovers(self) -> bool:
        """A load is a recovery: the newest whole checkpoint found first (resume=latest,
        or a tiered run's read, which also chooses its tier)."""
        return bool(self.checkpoint.num_checkpoints_read) and (self.checkpoint.resume == "latest" or self.has_tiers)

    @property
    def recovery(self) -> RecoveryConfig:
        return self.sections.recovery

    @property
    def persistent_interval_s(self) -> float:
        """Seconds a persistent save must fit in (tiers.interval_s, else DLIO's time between them)."""
        t = self.tiers
        return t.interval_s or t.persistent_every * (self.training_s or self.checkpoint.time_between_checkpoints)

    @property
    def model(self) -> ModelConfig:
        return self.sections.model

    @property
    def checkpoint(self) -> CheckpointConfig:
        return self.sections.checkpoint

    @property
    def streaming(self) -> StreamingConfig:
        return self.sections.streaming

    @property
    def storage(self) -> StorageConfig:
        return self.sections.storage

    @property
    def model_load(self) -> ModelLoadConfig:
        return self.sections.model_load

    @property
    def tiers(self) -> TiersConfig:
        return self.sections.tiers


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


#: S3's smallest multipart part (every part but an object's last)
S3_MIN_PART_SIZE = 5 * MiB


def s3_part_size(key: str, value: Any) -> int:
    """An S3 part size in bytes, refused under `key` with the value as typed."""
    size = parse_size(key, value)
    if size < S3_MIN_PART_SIZE:
        raise ConfigError(key, value, "at least 5MiB (the S3 minimum part size)")
    return size


#: (read_size, requests in flight) of each loader a model-load pattern emulates, on a file
#: system and on an object store (docs/model-loads.md has the sources and the measurements:
#: bench/model_load_bench.py against the safetensors library and runai-model-streamer)
LOADER_READS = {"safetensors": {"fs": (2 * MiB, 2), "s3": (2 * MiB, 2)},
                "runai": {"fs": (2 * MiB, 16), "s3": (8 * MiB, 16)},
                "fastsafetensors": {"fs": (16 * MiB, 16), "s3": (16 * MiB, 16)}}


def loader_reads(pattern: str, storage_type: str) -> tuple[int, int]:
    return LOADER_READS[pattern]["s3" if storage_type == "s3" else "fs"]


def _chunk_size(value, sto: StorageConfig) -> int:
    if value != "auto":
        return parse_size("workload.streaming.chunk_size", value)
    part = (sto.storage_options or {}).get("part_size") if sto.storage_type == "s3" else None
    if part is not None:
        key = "workload.storage.storage_options.part_size"
        size = s3_part_size(key, part)
        if size % MiB:  # chunk_size auto takes the part size, and chunks are whole MiB
            raise ConfigError(key, part, "a multiple of 1 MiB (1048576) while workload.streaming.chunk_size "
                                         "is auto (each part is one chunk), from 5MiB")
        return size
    return DEFAULT_CHUNK_SIZE.get(sto.storage_type, 32 * MiB)


def parse_size(key: str, value: Any) -> int:
    """Bytes from an int or a string such as '32MiB' (binary units)."""
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(key, value, "a byte count such as 33554432 or '32MiB'")
    return int(m.group(1)) * _UNITS[(m.group(2) or "")[:1].lower()]


def _check_keys(schema: type, given: Any, prefix: str) -> None:
    """Reject unknown keys, naming the allowed ones (OmegaConf names only the first)."""
    if not isinstance(given, (dict, DictConfig)):
        return
    hints = get_type_hints(schema)
    for key in given:
        if key not in hints:
            raise ConfigError(f"{prefix}{key}", given[key], "one of the keys " + ", ".join(hints))
        if is_dataclass(hints[key]):
            _check_keys(hints[key], given[key], f"{prefix}{key}.")


def structured(schema: type, given: Any, prefix: str) -> Any:
    """An instance of dataclass `schema` from `given`, or a ConfigError naming
    the first unknown key or ill-typed value (with `prefix` before its name).
    A schema with a validate(prefix) method checks its values' ranges there
    (not in __post_init__, whose errors OmegaConf rewraps)."""
    _check_keys(schema, given, prefix)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), given)
    except (ValidationError, ConfigKeyError) as exc:
        value = OmegaConf.select(OmegaConf.create(given), str(exc.full_key))
        raise ConfigError(f"{prefix}{exc.full_key}", value, str(exc).splitlines()[0]) from None
    obj = OmegaConf.to_object(merged)
    if hasattr(obj, "validate"):
        obj.validate(prefix)
    return obj


def _positive(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, value, "a positive integer")


def load_config(workload: DictConfig | dict, comm_size: int) -> RunConfig:
    """Validate our sections of `workload` for a job of comm_size ranks."""
    given = {k: workload[k] for k in ("model", "checkpoint", "streaming", "storage", "model_load", "tiers", "recovery",
                                    "goodput")
             if k in workload}
    for section in given.values():
        if isinstance(section, DictConfig):
            OmegaConf.resolve(section)
    s = structured(WorkloadSections, given, "workload.")

    m, c, st, sto = s.model, s.checkpoint, s.streaming, s.storage
    for key, val in (("checkpoint.num_checkpoints_write", c.num_checkpoints_write),
                     ("checkpoint.num_checkpoints_read", c.num_checkpoints_read)):
        if val < 0:
            raise ConfigError(f"workload.{key}", val, "an integer >= 0")
    if c.num_checkpoints_write + c.num_checkpoints_read == 0:
        raise ConfigError("workload.checkpoint.num_checkpoints_write", 0,
                          "at least 1 checkpoint written or read")
    try:
        layout = layouts.get(c.layout)
    except ConfigError as exc:
        raise ConfigError(f"workload.{exc.key}", exc.value, exc.allowed) from None
    # a training run reads the newest of the saves its loop made, however many
    trains = workload_trains(workload)
    if 0 < c.num_checkpoints_write < c.num_checkpoints_read and not layout.model_load and not trains:
        raise ConfigError("workload.checkpoint.num_checkpoints_read", c.num_checkpoints_read,
                          f"at most num_checkpoints_write ({c.num_checkpoints_write}), or set "
                          "num_checkpoints_write=0 to read checkpoints an earlier run wrote")
    if c.time_between_checkpoints < 0:
        raise ConfigError("workload.checkpoint.time_between_checkpoints", c.time_between_checkpoints,
                          "seconds >= 0")
    if not c.checkpoint_folder:
        raise ConfigError("workload.checkpoint.checkpoint_folder", c.checkpoint_folder, "a non-empty path")
    if c.async_mode not in ASYNC_MODES:
        raise ConfigError("workload.checkpoint.async_mode", c.async_mode, " or ".join(ASYNC_MODES))
    if sto.storage_type not in STORAGE_TYPES:
        raise ConfigError("workload.storage.storage_type", sto.storage_type, ", ".join(STORAGE_TYPES))

    if "://" in str(sto.storage_root) and not str(sto.storage_root).split("://", 1)[1].strip("/"):
        # checked as typed: joined with checkpoint_folder it would read as another path
        scheme = str(sto.storage_root).split("://", 1)[0]
        raise ConfigError("workload.storage.storage_root", sto.storage_root,
                          f"a {scheme}:// URI that names its bucket, container or directory "
                          f"({scheme}://NAME[/PREFIX])")
    chunk = _chunk_size(st.chunk_size, sto)
    if chunk <= 0 or chunk % MiB:
        raise ConfigError("workload.streaming.chunk_size", st.chunk_size,
                          "a positive multiple of 1 MiB (1048576)")
    if isinstance(st.stall_warning_s, bool) or not isinstance(st.stall_warning_s, (int, float)) \
            or st.stall_warning_s < 0:
        raise ConfigError("workload.streaming.stall_warning_s", st.stall_warning_s, "seconds >= 0 (0: never)")
    for key in ("pool_depth", "dedup_ratio", "compress_ratio"):
        _positive(f"workload.streaming.{key}", getattr(st, key))
    if st.content not in CONTENTS:
        raise ConfigError("workload.streaming.content", st.content, " or ".join(CONTENTS))
    if st.content != "incompressible" and (st.dedup_ratio, st.compress_ratio) != (1, 1):
        raise ConfigError("workload.streaming.content", st.content,
                          "incompressible with dedup_ratio or compress_ratio other than 1 (dgen-py's ratios "
                          "shape the bytes themselves)")
    if isinstance(st.read_parallelism, bool) or st.read_parallelism < 0:
        raise ConfigError("workload.streaming.read_parallelism", st.read_parallelism,
                          "0 (the storage's default) or a positive integer")
    if isinstance(st.concurrent_files, bool) or st.concurrent_files < 0:
        raise ConfigError("workload.streaming.concurrent_files", st.concurrent_files,
                          "0 (the storage's default) or a positive integer")
    if st.concurrent_files > 1 and sto.storage_type != "s3":
        raise ConfigError("workload.streaming.concurrent_files", st.concurrent_files,
                          "1 (or 0) with storage_type " + sto.storage_type + ": files written at once would "
                          "share one buffer pool; more than 1 is for s3")
    if st.pool_depth < 2:
        raise ConfigError("workload.streaming.pool_depth", st.pool_depth,
                          "at least 2 (one buffer filling while one is in I/O)")
    read_size = parse_size("workload.streaming.read_size", st.read_size)
    if read_size <= 0 or read_size % MiB:
        raise ConfigError("workload.streaming.read_size", st.read_size, "a positive multiple of 1 MiB (1048576)")
    if st.gen_threads < 0:
        raise ConfigError("workload.streaming.gen_threads", st.gen_threads, "0 (automatic) or more")

    _check_restore(c, comm_size)
    _check_recovery(s, comm_size)
    _check_goodput(s.goodput)
    read_size = _check_model_load(s, layout, read_size)
    training_s = training_between_checkpoints(workload, c)
    _check_tiers(s, layout, training_s, trains)

    shape = plan.ModelShape(m.num_layers, m.transformer.hidden_size, m.transformer.ffn_hidden_size,
                            m.transformer.vocab_size, m.transformer.num_attention_heads,
                            m.transformer.num_kv_heads, m.model_datatype, m.optimizer_datatype)
    par = plan.Parallelism(m.parallelism.tensor, m.parallelism.pipeline, m.parallelism.zero_stage,
                           m.parallelism.data, c.mode, c.layout,
                           safetensors_plan.parse_shard_size("workload.model_load.max_shard_size",
                                                             s.model_load.max_shard_size), c.replicas,
                           _deepspeed_files(c, layout), *_devices(c, layout),
                           _overlap_grad_reduce(m.parallelism, layout))
    layout = layouts.of(par)
    if trains and layout.model_load:
        raise ConfigError("workload.workflow.train", True, f"False with checkpoint.layout {layout.name} (a "
                          "publish is no training checkpoint)")
    cfg = RunConfig(s, shape, par, chunk, read_size, training_s, trains)
    try:
        layout.validate(shape, par, comm_size)
        layout.validate_job(shape, par, cfg.load_job(comm_size))
    except ConfigError as exc:
        key = exc.key if exc.key.startswith(("MPI", "rank")) else f"workload.{exc.key}"
        raise ConfigError(key, exc.value, exc.allowed) from None
    if st.verify and (st.dedup_ratio, st.compress_ratio) != (1, 1) \
            and layout.reads_inside_files(cfg.load_job(comm_size)):
        raise ConfigError("workload.streaming.verify", st.verify,
                          f"False for this {layout.name} restore with dedup_ratio or compress_ratio other than 1 "
                          "(it reads saved items from inside files; such content regenerates only from a file's "
                          "start)")
    return cfg


#: streaming.content: dgen-py's incompressible bytes, or numbers shaped as tensors' (engine/content.py)
CONTENTS = ("incompressible", "tensors")
#: checkpoint.deepspeed_files: upstream DLIO's files, or DeepSpeed's own
DEEPSPEED_FILES = ("dlio", "deepspeed")
#: checkpoint.platform: Orbax saves replicated arrays replica-parallel except on GPUs
PLATFORMS = ("tpu", "gpu")


def _check_goodput(g: GoodputConfig) -> None:
    """workload.goodput: a failure rate, non-negative times, a share or -1, positive node counts."""
    for key, value, low in (("failures_per_node_day", g.failures_per_node_day, 0.0), ("restart_s", g.restart_s, None),
                            ("interval_s", g.interval_s, None)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (low is not None and value <= low):
            raise ConfigError(f"workload.goodput.{key}", value, "a number > 0" if low is not None else "seconds >= 0")
    if g.local_share != -1 and not 0 <= g.local_share <= 1:
        raise ConfigError("workload.goodput.local_share", g.local_share, "a share from 0 to 1, or -1 (0 and 1 as bounds)")
    if not isinstance(g.nodes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                for n in g.nodes):
        raise ConfigError("workload.goodput.nodes", g.nodes, "a list of positive node counts")


def _overlap_grad_reduce(par: ParallelismConfig, layout: Layout) -> bool:
    """model.parallelism.overlap_grad_reduce: only Megatron's distributed optimizer has DDP buckets."""
    if not isinstance(par.overlap_grad_reduce, bool):
        raise ConfigError("workload.model.parallelism.overlap_grad_reduce", par.overlap_grad_reduce, "true or false")
    if not par.overlap_grad_reduce and not layout.has_buckets:
        raise ConfigError("workload.model.parallelism.overlap_grad_reduce", False,
                          f"true (the default) with checkpoint.layout {layout.name} (only Megatron's distributed "
                          "optimizer saves its state by DDP bucket)")
    return par.overlap_grad_reduce


def _devices(c: CheckpointConfig, layout: Layout) -> tuple[int, bool]:
    """(devices a rank, replica-parallel save) of checkpoint.devices_per_rank and platform."""
    if isinstance(c.devices_per_rank, bool) or not isinstance(c.devices_per_rank, int) or c.devices_per_rank < 1:
        raise ConfigError("workload.checkpoint.devices_per_rank", c.devices_per_rank, "a positive integer")
    if c.platform not in PLATFORMS:
        raise ConfigError("workload.checkpoint.platform", c.platform, " or ".join(PLATFORMS))
    if not layout.has_devices:
        if c.devices_per_rank != 1:
            raise ConfigError("workload.checkpoint.devices_per_rank", c.devices_per_rank,
                              f"1 with checkpoint.layout {layout.name} (a rank is one device's process)")
        if c.platform != "tpu":
            raise ConfigError("workload.checkpoint.platform", c.platform,
                              f"tpu (the default) with checkpoint.layout {layout.name} (only Orbax's save "
                              "depends on it)")
    return c.devices_per_rank, c.platform != "gpu"


def _deepspeed_files(c: CheckpointConfig, layout: Layout) -> bool:
    """Whether the deepspeed layout writes DeepSpeed's own files (checkpoint.deepspeed_files)."""
    if c.deepspeed_files not in DEEPSPEED_FILES:
        raise ConfigError("workload.checkpoint.deepspeed_files", c.deepspeed_files, " or ".join(DEEPSPEED_FILES))
    if c.deepspeed_files != "dlio" and not layout.has_framework_files:
        raise ConfigError("workload.checkpoint.deepspeed_files", c.deepspeed_files,
                          f"dlio with checkpoint.layout {layout.name} (it chooses the deepspeed layout's files)")
    return c.deepspeed_files != DEEPSPEED_FILES[0]  # DeepSpeed's own


def _check_model_load(s: WorkloadSections, layout: Layout, read_size: int) -> int:
    """Model loads' own keys; returns the read size a run's loads use."""
    ml, c = s.model_load, s.checkpoint
    if ml.pattern not in LOADER_READS:
        raise ConfigError("workload.model_load.pattern", ml.pattern, ", ".join(LOADER_READS))
    if isinstance(ml.read_parallelism, bool) or ml.read_parallelism < 0:
        raise ConfigError("workload.model_load.read_parallelism", ml.read_parallelism,
                          "0 (the loader's own) or a positive integer")
    if not layout.model_load:
        return read_size
    for key, value, default in (("restore", c.restore, "own"), ("share", c.share, "none")):
        if value != default:
            raise ConfigError(f"workload.checkpoint.{key}", value,
                              f"{default} with checkpoint.layout {layout.name} (a model load's reads are "
                              "workload.model_load.pattern's)")
    if c.async_mode != "disabled":
        raise ConfigError("workload.checkpoint.async_mode", c.async_mode,
                          f"disabled with checkpoint.layout {layout.name} (a publish is no training checkpoint)")
    if ml.read_size == "auto":
        return loader_reads(ml.pattern, s.storage.storage_type)[0]
    size = parse_size("workload.model_load.read_size", ml.read_size)
    if size <= 0 or size % MiB:
        raise ConfigError("workload.model_load.read_size", ml.read_size, "auto or a positive multiple of 1 MiB")
    return size


def join_root(storage_root: str, folder: str) -> str:
    """storage_root/checkpoint_folder for paths and URIs alike."""
    if "://" in storage_root:
        return storage_root.rstrip("/") + "/" + folder.strip("/")
    return posixpath.join(storage_root, folder)


def local_path(root: str) -> Optional[str]:
    """The directory a storage root names on this host (file:// and direct://
    included), or None for an object store."""
    scheme, sep, rest = str(root).partition("://")
    if not sep:
        return os.path.realpath(root)
    return os.path.realpath("/" + rest.lstrip("/")) if scheme in ("file", "direct") else None


def workload_trains(workload: DictConfig | dict) -> bool:
    """A training workflow: DLIO's training loop asks for the checkpoints."""
    return bool((workload.get("workflow") or {}).get("train", False))


def training_between_checkpoints(workload: DictConfig | dict, c: CheckpointConfig) -> float:
    """DLIO's computation between two checkpoints of a training workflow:
    checkpoint.steps_between_checkpoints x train.computation_time (its mean
    when a distribution); 0 where the workflow does not train or checkpoints
    per epoch (an epoch's steps follow from the dataset, not from this section)."""
    if not workload_trains(workload) or c.steps_between_checkpoints <= 0:
        return 0.0
    compute = (workload.get("train") or {}).get("computation_time", 0)
    if isinstance(compute, (dict, DictConfig)):
        compute = compute.get("mean", 0)
    try:
        return c.steps_between_checkpoints * max(0.0, float(compute))
    except (TypeError, ValueError):
        return 0.0


def _check_tiers(s: WorkloadSections, layout: Layout, training_s: float, trains: bool) -> None:
    """workload.tiers' keys, against each other and the checkpoint section
    (whose num_checkpoints_write a training loop's saves replace)."""
    t, c = s.tiers, s.checkpoint
    if not t.local_root:
        return
    for key in ("persistent_every", "replication"):
        _positive(f"workload.tiers.{key}", getattr(t, key))
    if isinstance(t.replication_jump, bool) or t.replication_jump < 0:
        raise ConfigError("workload.tiers.replication_jump", t.replication_jump,
                          "0 (the ranks per node) or a positive integer")
    if t.interval_s < 0:
        raise ConfigError("workload.tiers.interval_s", t.interval_s, "seconds >= 0")
    if not t.interval_s and not (training_s or c.time_between_checkpoints):
        raise ConfigError("workload.tiers.interval_s", t.interval_s,
                          "seconds > 0, or DLIO's computation between checkpoints to take it from "
                          "(checkpoint.time_between_checkpoints > 0, or a training workflow's "
                          "checkpoint.steps_between_checkpoints x train.computation_time): a persistent save must "
                          "fit in some interval")
    if isinstance(t.persistent_nice, bool) or not 0 <= t.persistent_nice <= 19:
        raise ConfigError("workload.tiers.persistent_nice", t.persistent_nice, "a nice value from 0 to 19")
    if t.persistent_io not in PERSISTENT_IO:
        raise ConfigError("workload.tiers.persistent_io", t.persistent_io, " or ".join(PERSISTENT_IO))
    if layout.model_load:
        raise ConfigError("workload.tiers.local_root", t.local_root,
                          f'"" with checkpoint.layout {layout.name} (a publish is no training checkpoint)')
    if c.num_checkpoints_write < t.persistent_every and not trains and (c.num_checkpoints_write or
                                                                         c.num_checkpoints_read != 1):
        raise ConfigError("workload.checkpoint.num_checkpoints_write", c.num_checkpoints_write,
                          f"at least tiers.persistent_every ({t.persistent_every}): a tiered run saves at least "
                          "one persistent checkpoint (or none, when it only comes back from a failure: "
                          "num_checkpoints_read=1)")
    if c.num_checkpoints_read > 1:
        raise ConfigError("workload.checkpoint.num_checkpoints_read", c.num_checkpoints_read,
                          "0 or 1 with tiers: a tiered run's read is its recovery, from the tier Megatron would "
                          "choose (docs/recovery.md)")
    checkpoints = local_path(join_root(str(s.storage.storage_root), c.checkpoint_folder))
    local = os.path.realpath(t.local_root)
    if checkpoints is not None and (os.path.commonpath([local, checkpoints]) in (local, checkpoints)):
        raise ConfigError("workload.tiers.local_root", t.local_root,
                          f"a folder outside the checkpoint folder {checkpoints} and not holding it: each tier's "
                          "files would be counted among the other's")


#: checkpoint.resume: the steps in turn, or the newest whole checkpoint as a restarting job finds it
RESUMES = ("", "latest")


def _check_recovery(s: WorkloadSections, comm_size: int) -> None:
    """checkpoint.resume and workload.recovery: one restore of the newest, lost ranks of this job."""
    c, lost = s.checkpoint, s.recovery.lost_ranks
    if c.resume not in RESUMES:
        raise ConfigError("workload.checkpoint.resume", c.resume, '"" (the steps in turn) or latest')
    if c.resume and c.num_checkpoints_read != 1:
        raise ConfigError("workload.checkpoint.num_checkpoints_read", c.num_checkpoints_read,
                          "1 with resume=latest (a restarting job restores once)")
    if not lost:
        return
    if not isinstance(lost, list) or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < comm_size
                                             for r in lost) or len(set(lost)) != len(lost):
        raise ConfigError("workload.recovery.lost_ranks", lost, f"a list of distinct ranks from 0 to {comm_size - 1}")
    if not s.tiers.local_root or c.num_checkpoints_read != 1:
        raise ConfigError("workload.recovery.lost_ranks", lost,
                          "[] unless a tiered run (tiers.local_root) recovers (num_checkpoints_read=1): only the "
                          "local tier loses what a replaced node held")


def _check_restore(c: CheckpointConfig, comm_size: int) -> None:
    """The restore keys that depend on nothing but each other and the run."""
    if c.restore not in load_plan.RESTORE_PATTERNS:
        raise ConfigError("workload.checkpoint.restore", c.restore, " or ".join(load_plan.RESTORE_PATTERNS))
    if c.share not in load_plan.SHARE_MODES:
        raise ConfigError("workload.checkpoint.share", c.share, " or ".join(load_plan.SHARE_MODES))
    if isinstance(c.saved_ranks, bool) or c.saved_ranks < 0:
        raise ConfigError("workload.checkpoint.saved_ranks", c.saved_ranks, "0 (this run's ranks) or a positive "
                                                                            "integer")
    if c.saved_ranks not in (0, comm_size) and c.num_checkpoints_write:
        raise ConfigError("workload.checkpoint.saved_ranks", c.saved_ranks,
                          f"0 or this run's {comm_size} ranks while it writes checkpoints "
                          f"(num_checkpoints_write={c.num_checkpoints_write}); a checkpoint saved at "
                          "another world size is read with num_checkpoints_write=0")
    if c.recovery_rank_shift and c.restore != "own":
        raise ConfigError("workload.checkpoint.recovery_rank_shift", True,
                          f"False with restore={c.restore} (the shift chooses whose own files a rank reads: "
                          "restore=own)")
