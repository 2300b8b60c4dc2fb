"""Orbax's OCDBT checkpoints with zarr3 and zstd, as MaxText writes them
(orbax-checkpoint 0.12, MaxText's checkpointing.py; docs/layouts.md has the sources):

    {step}/_CHECKPOINT_METADATA, {step}/commit_success.txt
    {step}/items/_METADATA, _sharding, manifest.ocdbt, d/<32 hex>, commit_success.txt
    {step}/items/array_metadatas/process_{i}
    {step}/items/ocdbt.process_{i}/manifest.ocdbt, d/<32 hex>...

Every rank is one JAX process driving `checkpoint.devices_per_rank` devices (a
host's accelerators) and writing all their shards into its own
`ocdbt.process_{i}`. MaxText's state (params, Adam's mu and nu, fp32) is
sharded over all devices on each array's embed axis (its default mesh: FSDP
over the slice), `checkpoint.replicas` slices replicating it. Each process
appends its chunks (one a device shard, the replica-parallel save's slice of
it when replicated: replica r writes slice r of R, unless
`checkpoint.platform=gpu` turns that off) to its own data files,
zstd-compressed, one file an OCDBT commit (cut as real saves cut them, and at
the target size), rewriting its manifest at each commit; values of 1 KiB or
less live inline in the B-tree. Process 0 writes the metadata and, once every
process is done, merges the B-trees (not the data) into the item's root and
marks the commit; on storage with directories the item's
`.orbax-checkpoint-tmp` folder is renamed, then the step's.
Compared file for file with real saves in docs/fidelity.md.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Optional

from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape
from dlio_ckpt_ext.shared_plans import load_plan, plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan, ShardFile

ITEM = "items"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: ocdbt_target_data_file_size: MaxText passes 2 GiB on every storage (Orbax's own default
#: is 2 GiB too, 400 MiB on GCS when a caller passes none)
TARGET_DATA_FILE_BYTES = 2 << 30
#: max_inline_value_bytes: smaller values live in the B-tree's leaves, not in data files
INLINE_BYTES = 1024
#: a zarr3 shard of one chunk: its index entry (16 bytes) and its crc32c (4) after the data
CHUNK_OVERHEAD = 20
#: a B-tree (compressed, as OCDBT writes its nodes): an entry a chunk (its key, the data
#: file, offset and length it points to), and the inline values, which shrink to this share;
#: fitted on five real saves' merged trees (orbax-checkpoint 0.12.4, fidelity/manifests),
#: within 3.9 KB of each
BTREE_ENTRY_BYTES = 93
BTREE_INLINE_SHARE = 0.134
#: the item's merged manifest
ROOT_MANIFEST_BYTES = 117
#: TensorStore's OCDBT commits, as real saves made them (fidelity/manifests, docs/fidelity.md):
#: process 0 first commits the arrays' zarr.json entries in a few small files, then every
#: process flushes its chunks in a few commits, cut by timing, not at the target size; each
#: commit writes one new file into the process's d/ and rewrites its manifest.ocdbt through
#: a lock file, fsync and rename. The counts vary from save to save: these are the usual
METADATA_COMMITS = 3
METADATA_COMMIT_BYTES = (273, 700)   # the first such file, then each next
#: where a process's data commits cut its bytes (cumulative shares): process 0's, the others'
FLUSHES = ((0.08, 0.17), (0.15,))
DATA_FILE_ALIGN = 4096               # a data file's size is padded to this
#: a process's manifest.ocdbt lists every version: its bytes after v commits
MANIFEST_BYTES, MANIFEST_VERSION_BYTES = 94, 42
LOCK_SUFFIX = ".__lock"
#: the 0-d arrays of MaxText's state (the step, Adam's and the schedule's counts): inline
SCALARS = ("step", "opt_state.0.count", "opt_state.2.count")
CHECKPOINT_METADATA, COMMIT_SUCCESS = "_CHECKPOINT_METADATA", "commit_success.txt"
#: commit_success.txt: Orbax writes it on every storage, naming the folder it commits
COMMIT_TEXT = "Checkpoint commit was successful to {}"
#: fixed nanosecond times in _CHECKPOINT_METADATA (a real one holds two 19-digit times)
TIMESTAMP_NS = 1_800_000_000_000_000_000
#: stored / raw bytes of a chunk after zstd level 3 (TensorStore's default level), measured
#: on generated tensors by bench/zstd_ratio.py (docs/layouts.md): trained fp32 weights, Adam's
#: first moments and second moments, and bf16 weights
ZSTD_STORED = {("params", 4): 0.927, ("mu", 4): 0.928, ("nu", 4): 0.872, ("params", 2): 0.780,
               ("mu", 2): 0.782, ("nu", 2): 0.628}


@dataclass(frozen=True)
class Leaf:
    """One array of the state: its keypath, shape and the axis FSDP shards (None: replicated)."""
    name: str
    shape: tuple[int, ...]
    axis: Optional[int]
    state: str          # params, mu or nu
    itemsize: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@lru_cache(maxsize=64)
def leaves(m: ModelShape) -> tuple[Leaf, ...]:
    """MaxText's LLaMA state as it saves it (scan_layers: the layers stacked on axis 1):
    params, then Adam's mu and nu of each (optax's ScaleByAdamState), each with the
    logical axes MaxText gives it ('embed' sharded by FSDP, norms replicated)."""
    h, f, v = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    heads, kv, hd, layers = m.num_attention_heads, m.num_kv_heads, h // m.num_attention_heads, m.num_layers
    d = "decoder.layers."
    shapes = [("token_embedder.embedding", (v, h), 1),
              (d + "pre_self_attention_layer_norm.scale", (h, layers), None),
              (d + "self_attention.query.kernel", (h, layers, heads, hd), 0),
              (d + "self_attention.key.kernel", (h, layers, kv, hd), 0),
              (d + "self_attention.value.kernel", (h, layers, kv, hd), 0),
              (d + "self_attention.out.kernel", (heads, layers, hd, h), 3),
              (d + "post_self_attention_layer_norm.scale", (h, layers), None),
              (d + "mlp.wi_0.kernel", (h, layers, f), 0),
              (d + "mlp.wi_1.kernel", (h, layers, f), 0),
              (d + "mlp.wo.kernel", (f, layers, h), 2),
              ("decoder.decoder_norm.scale", (h,), None),
              ("decoder.logits_dense.kernel", (h, v), 0)]
    mbytes = plan.dtype_bytes("model.model_datatype", m.model_datatype)
    obytes = plan.dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
    prefix = {"params": "params.params.", "mu": "opt_state.0.mu.params.", "nu": "opt_state.0.nu.params."}
    return tuple(Leaf(prefix[state] + name, shape, axis, state, mbytes if state == "params" else obytes)
                 for state in ("params", "mu", "nu") for name, shape, axis in shapes)


def stored_bytes(leaf: Leaf, elements: int) -> int:
    """A chunk's bytes in its data file: zstd's output and the shard's index."""
    raw = elements * leaf.itemsize
    return -(-raw * _ratio_ppm(leaf) // 1_000_000) + CHUNK_OVERHEAD


def _ratio_ppm(leaf: Leaf) -> int:
    return round(ZSTD_STORED.get((leaf.state, leaf.itemsize), 1.0) * 1_000_000)


def data_file_name(process: int, k: int) -> str:
    """TensorStore names a data file by 16 random bytes in hex: ours are a hash of
    (process, file), so every rank knows every name without asking."""
    return hashlib.blake2b(f"ocdbt/{process}/{k}".encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Chunk:
    """One stored value: a piece of a leaf written by one process."""
    leaf: int           # index into leaves()
    shard: int          # the FSDP shard it belongs to
    piece: int          # replica-parallel slice of the shard (0 when one replica writes it)
    stored: int         # its bytes in a data file (0: inline in the B-tree)
    elements: int


@dataclass(frozen=True)
class Mesh:
    """Devices as MaxText's mesh places them (FSDP within a slice, slices replicas),
    `per_process` of them driven by each process (rank), in device order."""
    fsdp: int
    replicas: int
    per_process: int = 1

    @property
    def devices(self) -> int:
        return self.fsdp * self.replicas

    def position(self, device: int) -> tuple[int, int]:
        """(replica, fsdp rank) of a device."""
        return device // self.fsdp, device % self.fsdp

    def of_process(self, rank: int) -> range:
        return range(rank * self.per_process, (rank + 1) * self.per_process)


def _mesh(p: Parallelism, world: int) -> Mesh:
    return Mesh(world * p.devices // p.replicas, p.replicas, p.devices)


def _shard_split(leaf: Leaf, shards: int, copies: int, replica_parallel: bool) -> tuple[int, int]:
    """(pieces a shard is saved in, elements of each): the replica-parallel save slices a
    shard R ways along its first axis that R divides; otherwise (or with it off, as on
    GPUs) replica 0 writes it whole."""
    shape = list(leaf.shape)
    if leaf.axis is not None:
        shape[leaf.axis] //= shards
    elements = leaf.elements // shards
    if replica_parallel and copies > 1 and any(d % copies == 0 for d in shape):
        return copies, elements // copies
    return 1, elements


@lru_cache(maxsize=64)
def _leaf_shards(m: ModelShape, p: Parallelism, world: int) -> tuple[tuple[int, bool, int, int, int], ...]:
    """Each leaf's shard as every device holds it, the same on every process: (leaf, whether
    FSDP shards it, pieces it is saved in, elements a piece, stored bytes a piece or 0 inline)."""
    mesh = _mesh(p, world)
    out = []
    for i, leaf in enumerate(leaves(m)):
        shards = mesh.fsdp if leaf.axis is not None else 1
        pieces, elements = _shard_split(leaf, shards, mesh.devices // shards, p.replica_parallel)
        stored = stored_bytes(leaf, elements)
        out.append((i, leaf.axis is not None, pieces, elements, stored if stored > INLINE_BYTES else 0))
    return tuple(out)


@lru_cache(maxsize=8192)
def process_chunks(m: ModelShape, p: Parallelism, world: int, rank: int) -> tuple[Chunk, ...]:
    """The chunks process `rank` writes (its devices' shards), in the order it appends them."""
    mesh = _mesh(p, world)
    positions = [(device, *mesh.position(device)) for device in mesh.of_process(rank)]
    out = []
    for i, sharded, pieces, elements, stored in _leaf_shards(m, p, world):
        for device, replica, fsdp_rank in positions:
            copy = replica if sharded else device
            if pieces == 1 and copy:
                continue  # replica 0's copy is the one written
            out.append(Chunk(i, fsdp_rank if sharded else 0, copy if pieces > 1 else 0, stored, elements))
    return tuple(out)


@lru_cache(maxsize=8192)
def _commits(m: ModelShape, p: Parallelism, world: int, rank: int) -> tuple[tuple[int, tuple[Chunk, ...], bool], ...]:
    """Process `rank`'s data files, in order: (size, the stored chunks in it, whether
    an OCDBT commit ends with it). Process 0 first commits the arrays' zarr.json
    entries in METADATA_COMMITS small files, a commit each; then every process
    flushes its chunks, a commit at each of its FLUSHES shares of its bytes and at
    the end; a commit's bytes past the target size go on in a next file of the
    same commit (no manifest between them). Each file ends with its B-tree node
    so far, padded to DATA_FILE_ALIGN."""
    out: list[tuple[int, tuple[Chunk, ...], bool]] = []
    if rank == 0:
        out += [(METADATA_COMMIT_BYTES[min(k, 1)], (), True) for k in range(METADATA_COMMITS)]
    chunks = process_chunks(m, p, world, rank)
    total = sum(c.stored for c in chunks)
    cuts = [share * total for share in FLUSHES[min(rank, 1)]]
    files: list[list[Chunk]] = [[]]
    commits: list[bool] = []  # per file but the last: whether a commit ended with it
    size = done = 0
    for c in chunks:
        flush = bool(cuts) and done >= cuts[0]
        if c.stored and files[-1] and (size >= TARGET_DATA_FILE_BYTES or flush):
            files.append([])
            commits.append(flush)
            size = 0
            cuts = [x for x in cuts if x > done]
        files[-1].append(c)
        size, done = size + c.stored, done + c.stored
    entries = 0
    for f, ends in zip(files, commits + [True]):
        entries += len(f)
        raw = sum(c.stored for c in f) + btree_bytes(process_chunks(m, p, world, rank)[:entries], leaves(m))
        out.append((-(-raw // DATA_FILE_ALIGN) * DATA_FILE_ALIGN, tuple(c for c in f if c.stored), ends))
    return tuple(out)


@lru_cache(maxsize=8192)
def data_files(m: ModelShape, p: Parallelism, world: int, rank: int) -> tuple[tuple[str, int], ...]:
    """(name, size) of process `rank`'s data files, one a commit, in writing order."""
    base = f"{ITEM}/ocdbt.process_{rank}/d/"
    return tuple((base + data_file_name(rank, k), size) for k, (size, *_) in enumerate(_commits(m, p, world, rank)))


def process_manifest_bytes(version: int) -> int:
    """A process's manifest.ocdbt after `version` commits (it lists every version)."""
    return MANIFEST_BYTES + MANIFEST_VERSION_BYTES * version


def btree_bytes(chunks: Iterable[Chunk], all_leaves: tuple[Leaf, ...]) -> int:
    """A B-tree of these chunks: an entry a chunk, with its value inline when it is small."""
    chunks = tuple(chunks)
    inline = sum(c.elements * all_leaves[c.leaf].itemsize for c in chunks if not c.stored)
    return BTREE_ENTRY_BYTES * len(chunks) + math.ceil(BTREE_INLINE_SHARE * inline)


def chunk_places(m: ModelShape, p: Parallelism, world: int, rank: int) -> dict[tuple[int, int, int], tuple[str, int, int]]:
    """(leaf, shard, piece) -> (data file, offset, stored bytes) of process `rank`'s stored chunks."""
    out = {}
    for (name, _), (_, chunks, _) in zip(data_files(m, p, world, rank), _commits(m, p, world, rank)):
        used = 0
        for c in chunks:
            out[(c.leaf, c.shard, c.piece)] = (name, used, c.stored)
            used += c.stored
    return out


def checkpoint_metadata() -> bytes:
    """_CHECKPOINT_METADATA: the step's item handlers and times (CheckpointManager),
    written when the save starts and again at its commit."""
    return json.dumps({"item_handlers": {ITEM: "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                                               "PyTreeCheckpointHandler"},
                       "metrics": {}, "performance_metrics": {}, "init_timestamp_nsecs": TIMESTAMP_NS,
                       "commit_timestamp_nsecs": TIMESTAMP_NS, "custom_metadata": {}}).encode()


def write_shape(leaf: Leaf, mesh: Mesh) -> list[int]:
    """A leaf's shard on one device (what _METADATA and array_metadatas record)."""
    shape = list(leaf.shape)
    if leaf.axis is not None:
        shape[leaf.axis] //= mesh.fsdp
    return shape


def _arrays(m: ModelShape, p: Parallelism, world: int) -> list[tuple[str, list[int]]]:
    """(keypath, write shape) of every array of the state, the scalars first."""
    mesh = _mesh(p, world)
    return [(name, []) for name in SCALARS] + [(leaf.name, write_shape(leaf, mesh)) for leaf in leaves(m)]


def _keys(name: str) -> list[dict]:
    return [{"key": k, "key_type": 1 if k.isdigit() else 2} for k in name.split(".")]


def item_metadata(m: ModelShape, p: Parallelism, world: int) -> bytes:
    """items/_METADATA: the tree's leaves (keyed by their keypath tuples) and how they were written."""
    tree = {str(tuple(name.split("."))): {"key_metadata": _keys(name), "value_metadata": {
        "value_type": "jax.Array", "skip_deserialize": False, "write_shape": shape}} for name, shape in _arrays(m, p, world)}
    tree["('opt_state', '1')"] = {"key_metadata": _keys("opt_state.1"),
                                  "value_metadata": {"value_type": "None", "skip_deserialize": True}}
    return json.dumps({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                       "store_array_data_equal_to_fill_value": True, "custom_metadata": None}).encode()


def sharding(m: ModelShape, p: Parallelism, world: int) -> bytes:
    """items/_sharding: each array's NamedSharding, every device of the mesh listed."""
    mesh = _mesh(p, world)
    devices = [{"id": d} for d in range(mesh.devices)]
    out = {}
    for name, shape in _arrays(m, p, world):
        leaf = next((x for x in leaves(m) if x.name == name), None)
        spec = [None] * len(shape)
        if leaf is not None and leaf.axis is not None:
            spec[leaf.axis] = "fsdp"
        key = base64.urlsafe_b64encode(name.encode()).decode()
        out[key] = json.dumps({"sharding_type": "NamedSharding", "shape": [mesh.devices], "axis_names": ["fsdp"],
                               "axis_types": ["AxisType.Auto"], "partition_spec": spec, "device_mesh": {"mesh": devices}})
    return json.dumps(out, separators=(",", ":")).encode()


def array_metadatas(m: ModelShape, p: Parallelism, world: int) -> bytes:
    """items/array_metadatas/process_{i}: every array's write and chunk shape (each process lists all)."""
    return json.dumps({"array_metadatas": [{"array_metadata": {"param_name": name, "write_shape": shape,
                                                               "chunk_shape": shape, "ext_metadata": None}}
                                           for name, shape in _arrays(m, p, world)]}).encode()


def _text(name: str, content: bytes, tmp_suffix: str = "") -> ShardFile:
    return ShardFile(name, len(content), "metadata", content, tmp_suffix)


class Orbax(Layout):
    name = "orbax"
    committed = True
    has_replicas = True
    has_devices = True
    durability = ("TensorStore fsyncs each data file, the manifest's lock file and their folders at every "
                  "commit; the JSON metadata and commit_success.txt are not fsynced; two folder renames")
    framework = "Orbax (OCDBT, zarr3 + zstd; MaxText)"
    reshards = "Orbax's restore onto the new mesh (each process reads the chunks its devices need)"

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return str(step)

    def staging_dir(self, step: int, epoch: int = 1) -> Optional[str]:
        return f"{step}{TMP_SUFFIX}"

    def item_staging(self) -> Optional[tuple[str, str]]:
        return ITEM, f"{ITEM}{TMP_SUFFIX}"

    def find_latest(self, look: discovery.Look, expected: discovery.Expected) -> discovery.Latest:
        # a folder renamed from its temporary name is committed; where nothing is renamed, commit_success.txt says so
        marker = None if look.backend.has_directories else COMMIT_SUCCESS
        return discovery.by_commit(self, look, marker, CHECKPOINT_METADATA)

    def saved_shape(self, look: discovery.Look, name: str) -> Optional[SavedShape]:
        # the restore's sharding metadata (every device of the mesh) and the processes that wrote
        processes = sum(1 for n in look.list(f"{name}/{ITEM}") if n.startswith("ocdbt.process_"))
        return saved_shape.from_orbax(look.read(f"{name}/{ITEM}/_sharding"), processes)

    def subdirs(self, m: ModelShape, p: Parallelism, world: int) -> list[str]:
        return [ITEM, f"{ITEM}/d", f"{ITEM}/array_metadatas"] + [
            d for r in range(world) for d in (f"{ITEM}/ocdbt.process_{r}", f"{ITEM}/ocdbt.process_{r}/d")]

    def check(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        if p.tensor != 1 or p.pipeline != 1:
            raise ConfigError("model.parallelism.tensor" if p.tensor != 1 else "model.parallelism.pipeline",
                              p.tensor if p.tensor != 1 else p.pipeline,
                              "1 with checkpoint.layout orbax (MaxText's default mesh shards every array over "
                              "all devices: FSDP; checkpoint.replicas sets the replicas)")
        if p.mode != "default":
            raise ConfigError("checkpoint.mode", p.mode, "default with checkpoint.layout orbax")
        devices = comm_size * p.devices
        if devices % p.replicas:
            raise ConfigError("MPI world size", comm_size,
                              f"a world whose devices ({p.devices} a rank) are a multiple of checkpoint.replicas "
                              f"= {p.replicas}")
        fsdp = devices // p.replicas
        if m.hidden_size % fsdp:
            raise ConfigError("MPI world size", comm_size,
                              f"a world whose FSDP degree ({fsdp}: {p.devices} devices a rank) divides hidden_size "
                              f"{m.hidden_size} (every array is sharded on its embed axis)")

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        """Process `rank`'s save: (process 0) _CHECKPOINT_METADATA at the start; each
        OCDBT commit's data file and its manifest rewritten; the array metadata;
        (process 0) _sharding. Process 0 commits once every process is done: the
        merged B-tree and manifest, _METADATA and the item's commit_success.txt, the
        item renamed, then the step's _CHECKPOINT_METADATA and commit_success.txt,
        the step renamed."""
        mesh = _mesh(p, world)
        replica, fsdp_rank = mesh.position(mesh.of_process(rank)[0])
        manifest = f"{ITEM}/ocdbt.process_{rank}/manifest.ocdbt"
        files = [_text(CHECKPOINT_METADATA, checkpoint_metadata())] if rank == 0 else []
        version = 0
        for (name, size), (_, chunks, ends) in zip(data_files(m, p, world, rank), _commits(m, p, world, rank)):
            files.append(ShardFile(name, size, "state" if chunks else "metadata"))
            if ends:  # the commit's manifest, rewritten through its lock file
                version += 1
                files.append(ShardFile(manifest, process_manifest_bytes(version), "metadata",
                                       tmp_suffix=LOCK_SUFFIX))
        files.append(_text(f"{ITEM}/array_metadatas/process_{rank}", array_metadatas(m, p, world)))
        commit: tuple[ShardFile, ...] = ()
        if rank == 0:
            files.append(_text(f"{ITEM}/_sharding", sharding(m, p, world), LOCK_SUFFIX))
            merged = sum(btree_bytes(process_chunks(m, p, world, r), leaves(m)) for r in range(world))
            commit = (ShardFile(f"{ITEM}/d/{data_file_name(-1, 0)}", merged, "metadata"),
                      ShardFile(f"{ITEM}/manifest.ocdbt", ROOT_MANIFEST_BYTES, "metadata", tmp_suffix=LOCK_SUFFIX),
                      _text(f"{ITEM}/_METADATA", item_metadata(m, p, world)),
                      _text(f"{ITEM}/commit_success.txt", COMMIT_TEXT.format(f"{ITEM}").encode()),
                      _text(CHECKPOINT_METADATA, checkpoint_metadata()),
                      _text(COMMIT_SUCCESS, COMMIT_TEXT.format(".").encode()))
        return RankPlan(rank, replica, 0, 0, fsdp_rank, tuple(files), commit)

    def facts(self, m: ModelShape, p: Parallelism, world: int) -> list[str]:
        files = [len(data_files(m, p, world, r)) for r in range(world)]
        return [f"processes: {world}, {p.devices} device(s) each, one ocdbt.process_{{i}} a process; "
                f"{min(files)}-{max(files)} data files a process (one an OCDBT commit); replica-parallel save "
                f"{'on' if p.replica_parallel else 'off (platform gpu)'}"]

    # -- loads ----------------------------------------------------------------
    def metadata_reads(self, m: ModelShape, p: Parallelism, job: LoadJob) -> list[ReadRange]:
        """What every process opens first: the step's and the item's metadata, the
        merged root manifest and B-tree (its leaves point into the process files)."""
        wanted = (CHECKPOINT_METADATA, f"{ITEM}/_METADATA", f"{ITEM}/manifest.ocdbt")
        commit = self.saved(m, p, job, 0).commit_files
        return [load_plan.whole(f, 0) for f in commit if f.name in wanted or f.name.startswith(f"{ITEM}/d/")]

    def framework_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        return list(_restore_reads(self, m, p, job, rank))

    def candidate_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange) -> Iterable[int]:
        """The ranks whose shards overlap the chunk's (of every replica), or all for a replicated leaf."""
        if job.pattern == "own":
            return super().candidate_readers(m, p, job, r)
        leaf_index, shard = _chunk_at(m, p, job.saved_ranks)[(r.name, r.offset)]
        leaf, mesh, saved = leaves(m)[leaf_index], _mesh(p, job.ranks), _mesh(p, job.saved_ranks)
        if leaf.axis is None:
            return range(job.ranks)
        per_new, per_old = leaf.shape[leaf.axis] // mesh.fsdp, leaf.shape[leaf.axis] // saved.fsdp
        fsdp = range(shard * per_old // per_new, ((shard + 1) * per_old - 1) // per_new + 1)
        # the processes driving those devices, in order
        return list(dict.fromkeys((replica * mesh.fsdp + f) // mesh.per_process
                                  for replica in range(mesh.replicas) for f in fsdp))

    def range_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange,
                      rank: int = 0) -> tuple[int, ...]:
        # a chunk is read whole by every rank its shard overlaps: the candidates are exact,
        # and filtering them by their reads would cost O(ranks x ranges) on every rank
        if job.pattern == "own" or (r.name, r.offset) not in _chunk_at(m, p, job.saved_ranks):
            return super().range_readers(m, p, job, r, rank)
        return tuple(self.candidate_readers(m, p, job, r))

    def read_owner(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int, r: ReadRange,
                   reads: tuple[ReadRange, ...]) -> Optional[int]:
        """Single-replica restore (replica_axis_index): its first reader, in the first replica."""
        return None if job.pattern == "own" else self.range_readers(m, p, job, r, rank)[0]

    def owner_reads(self, job: LoadJob) -> bool:
        return job.pattern != "own"

    def storage_group(self, p: Parallelism, rank: int) -> Optional[int]:
        return 0  # every range is read once, by its first reader, whoever else needs it

    def reads_inside_files(self, job: LoadJob) -> bool:
        return job.pattern != "own"


@lru_cache(maxsize=8192)
def _restore_reads(layout: Orbax, m: ModelShape, p: Parallelism, job: LoadJob,
                   rank: int) -> tuple[ReadRange, ...]:
    """The chunks process `rank` needs for its shards at the loading world size: for
    each leaf the saved chunks of every saved shard overlapping its own (all of a
    replicated leaf), each read whole (a compressed chunk is decoded whole), in the
    order the leaves are restored; chunks inline in the B-tree come with it."""
    mesh, saved = _mesh(p, job.ranks), _mesh(p, job.saved_ranks)
    fsdp_ranks = sorted({mesh.position(d)[1] for d in mesh.of_process(rank)})
    places = _all_places(m, p, job.saved_ranks)
    out = []
    for i, leaf in enumerate(leaves(m)):
        if leaf.axis is None:
            shards = [0]
        else:  # the saved shards overlapping any of its devices' shards
            per_new, per_old = leaf.shape[leaf.axis] // mesh.fsdp, leaf.shape[leaf.axis] // saved.fsdp
            shards = list(dict.fromkeys(s for f in fsdp_ranks
                                        for s in range(f * per_new // per_old, ((f + 1) * per_new - 1) // per_old + 1)))
        for shard in shards:
            for (writer, name, offset, size) in places.get((i, shard), ()):
                out.append(ReadRange(name, offset, size, writer, _file_sizes(m, p, job.saved_ranks)[name]))
    return tuple(layout.metadata_reads(m, p, job) + out)


@lru_cache(maxsize=64)
def _all_places(m: ModelShape, p: Parallelism, world: int) -> dict[tuple[int, int], list[tuple[int, str, int, int]]]:
    """(leaf, shard) -> [(writer, data file, offset, stored bytes)] of its stored pieces, in piece order."""
    out: dict[tuple[int, int], list] = {}
    for w in range(world):
        for (leaf, shard, piece), (name, offset, size) in sorted(chunk_places(m, p, world, w).items()):
            out.setdefault((leaf, shard), []).append((piece, w, name, offset, size))
    return {k: [x[1:] for x in sorted(v)] for k, v in out.items()}


@lru_cache(maxsize=64)
def _file_sizes(m: ModelShape, p: Parallelism, world: int) -> dict[str, int]:
    """Every process's data file, name -> size."""
    return {name: size for w in range(world) for name, size in data_files(m, p, world, w)}


@lru_cache(maxsize=64)
def _chunk_at(m: ModelShape, p: Parallelism, world: int) -> dict[tuple[str, int], tuple[int, int]]:
    """(data file, offset) -> (leaf, shard) of every stored chunk."""
    return {(name, offset): key for key, places in _all_places(m, p, world).items()
            for _, name, offset, _ in places}


LAYOUT = Orbax()
