"""Orbax's OCDBT checkpoints with zarr3 and zstd, as MaxText writes them
(orbax-checkpoint 0.12, MaxText's checkpointing.py; docs/layouts.md has the sources):

    {step}/_CHECKPOINT_METADATA, {step}/commit_success.txt
    {step}/items/_METADATA, _sharding, manifest.ocdbt, d/<32 hex>, commit_success.txt
    {step}/items/array_metadatas/process_{i}
    {step}/items/ocdbt.process_{i}/manifest.ocdbt, d/<32 hex>...

Every rank is one JAX process with one device. MaxText's state (params, Adam's
mu and nu, fp32) is sharded over all devices on each array's embed axis (its
default mesh: FSDP over the slice), `checkpoint.replicas` slices replicating
it. Each process appends its chunks (one a device shard, the replica-parallel
save's slice of it when replicated: replica r writes slice r of R) to its own
data files, zstd-compressed, a new file once one reaches the target size;
values of 1 KiB or less live inline in the B-tree. Process 0 writes the
metadata and, once every process is done, merges the B-trees (not the data)
into the item's root, marks the commit and, on storage with directories,
renames the `.orbax-checkpoint-tmp` folder it wrote into.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Optional

from dlio_ckpt_ext import load_plan, plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.plan import ModelShape, Parallelism, RankPlan, ShardFile

ITEM = "items"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: ocdbt_target_data_file_size: MaxText passes 2 GiB on every storage (Orbax's own default
#: is 2 GiB too, 400 MiB on GCS when a caller passes none)
TARGET_DATA_FILE_BYTES = 2 << 30
#: max_inline_value_bytes: smaller values live in the B-tree's leaves, not in data files
INLINE_BYTES = 1024
#: a zarr3 shard of one chunk: its index entry (16 bytes) and its crc32c (4) after the data
CHUNK_OVERHEAD = 20
#: a B-tree leaf entry (its key, the param name and chunk index, and the data file, offset
#: and length it points to) and a manifest: estimates from Orbax's checked-in test
#: checkpoint (203 bytes a process manifest, 113 the merged one), not measured on a save
BTREE_ENTRY_BYTES = 100
PROCESS_MANIFEST_BYTES = 203
ROOT_MANIFEST_BYTES = 113
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
    """Processes (ranks) as MaxText's mesh places them: FSDP within a slice, slices replicas."""
    fsdp: int
    replicas: int

    def position(self, rank: int) -> tuple[int, int]:
        """(replica, fsdp rank) of a process."""
        return rank // self.fsdp, rank % self.fsdp


def _mesh(p: Parallelism, world: int) -> Mesh:
    return Mesh(world // p.replicas, p.replicas)


def _shard_split(leaf: Leaf, shards: int, copies: int) -> tuple[int, int]:
    """(pieces a shard is saved in, elements of each): the replica-parallel save slices a
    shard R ways along its first axis that R divides; otherwise replica 0 writes it whole."""
    shape = list(leaf.shape)
    if leaf.axis is not None:
        shape[leaf.axis] //= shards
    elements = leaf.elements // shards
    if copies > 1 and any(d % copies == 0 for d in shape):
        return copies, elements // copies
    return 1, elements


@lru_cache(maxsize=8192)
def process_chunks(m: ModelShape, p: Parallelism, world: int, rank: int) -> tuple[Chunk, ...]:
    """The chunks process `rank` writes, in the order it appends them."""
    mesh = _mesh(p, world)
    replica, fsdp_rank = mesh.position(rank)
    out = []
    for i, leaf in enumerate(leaves(m)):
        shards = mesh.fsdp if leaf.axis is not None else 1
        shard = fsdp_rank if leaf.axis is not None else 0
        copies = world // shards
        copy = replica if leaf.axis is not None else rank
        pieces, elements = _shard_split(leaf, shards, copies)
        if pieces == 1 and copy:
            continue  # replica 0's copy is the one written
        stored = stored_bytes(leaf, elements)
        out.append(Chunk(i, shard, copy if pieces > 1 else 0, stored if stored > INLINE_BYTES else 0, elements))
    return tuple(out)


@lru_cache(maxsize=8192)
def data_files(m: ModelShape, p: Parallelism, world: int, rank: int) -> tuple[tuple[str, int], ...]:
    """(name, size) of process `rank`'s data files: its chunks appended in order, a new
    file once one reaches the target; its B-tree (an entry a chunk, inline values
    in it) appended to the last."""
    files: list[list[int]] = [[]]
    for c in process_chunks(m, p, world, rank):
        if c.stored:
            if sum(files[-1]) >= TARGET_DATA_FILE_BYTES:
                files.append([])
            files[-1].append(c.stored)
    sizes = [sum(f) for f in files]
    sizes[-1] += btree_bytes(process_chunks(m, p, world, rank), leaves(m))
    base = f"{ITEM}/ocdbt.process_{rank}/d/"
    return tuple((base + data_file_name(rank, k), n) for k, n in enumerate(sizes))


def btree_bytes(chunks: Iterable[Chunk], all_leaves: tuple[Leaf, ...]) -> int:
    """A process's B-tree: an entry a chunk, with its value inline when it is small."""
    return sum(BTREE_ENTRY_BYTES + (0 if c.stored else c.elements * all_leaves[c.leaf].itemsize) for c in chunks)


def chunk_places(m: ModelShape, p: Parallelism, world: int, rank: int) -> dict[tuple[int, int, int], tuple[str, int, int]]:
    """(leaf, shard, piece) -> (data file, offset, stored bytes) of process `rank`'s stored chunks."""
    out = {}
    names = [name for name, _ in data_files(m, p, world, rank)]
    k, used = 0, 0
    for c in process_chunks(m, p, world, rank):
        if not c.stored:
            continue
        if used >= TARGET_DATA_FILE_BYTES:
            k, used = k + 1, 0
        out[(c.leaf, c.shard, c.piece)] = (names[k], used, c.stored)
        used += c.stored
    return out


def _json(value: object) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True).encode()


def checkpoint_metadata() -> bytes:
    """_CHECKPOINT_METADATA: the step's item handlers and times (CheckpointManager)."""
    return _json({"item_handlers": {ITEM: "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                                          "PyTreeCheckpointHandler"},
                  "metrics": {}, "performance_metrics": {}, "init_timestamp_nsecs": 0,
                  "commit_timestamp_nsecs": 0, "custom_metadata": {"scan_layers": True}})


def item_metadata(m: ModelShape) -> bytes:
    """items/_METADATA: the tree's leaves and how they were written."""
    tree = {leaf.name: {"key_metadata": [{"key": k, "key_type": 2} for k in leaf.name.split(".")],
                        "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False,
                                           "write_shape": list(leaf.shape)}} for leaf in leaves(m)}
    tree["step"] = {"key_metadata": [{"key": "step", "key_type": 2}],
                    "value_metadata": {"value_type": "scalar", "skip_deserialize": False}}
    return _json({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                  "store_array_data_equal_to_fill_value": True, "custom_metadata": None})


def sharding(m: ModelShape, world: int) -> bytes:
    """items/_sharding: each leaf's NamedSharding, every device of the mesh listed."""
    devices = list(range(world))
    out = {}
    for leaf in leaves(m):
        spec = [None] * len(leaf.shape)
        if leaf.axis is not None:
            spec[leaf.axis] = "fsdp"
        key = base64.urlsafe_b64encode(leaf.name.encode()).decode()
        out[key] = json.dumps({"sharding_type": "NamedSharding", "shape": [world], "axis_names": ["fsdp"],
                               "partition_spec": spec, "device_mesh": {"mesh": devices}})
    return _json(out)


def array_metadatas(m: ModelShape, p: Parallelism, world: int, rank: int) -> bytes:
    """items/array_metadatas/process_{rank}: the write and chunk shape of each leaf it wrote."""
    all_leaves = leaves(m)
    return _json({"array_metadatas": [{"array_metadata": {"param_name": all_leaves[c.leaf].name,
                                                          "elements": c.elements, "ext_metadata": {}}}
                                      for c in process_chunks(m, p, world, rank)]})


def _text(name: str, content: bytes) -> ShardFile:
    return ShardFile(name, len(content), "metadata", content)


class Orbax(Layout):
    name = "orbax"
    committed = True
    has_replicas = True
    framework = "Orbax (OCDBT, zarr3 + zstd; MaxText)"

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return str(step)

    def staging_dir(self, step: int, epoch: int = 1) -> Optional[str]:
        return f"{step}{TMP_SUFFIX}"

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
        if comm_size % p.replicas:
            raise ConfigError("MPI world size", comm_size,
                              f"a multiple of checkpoint.replicas = {p.replicas}")
        fsdp = comm_size // p.replicas
        if m.hidden_size % fsdp:
            raise ConfigError("MPI world size", comm_size,
                              f"a world whose FSDP degree ({fsdp}) divides hidden_size {m.hidden_size} (every "
                              "array is sharded on its embed axis)")

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        replica, fsdp_rank = _mesh(p, world).position(rank)
        files = [ShardFile(name, size, "state") for name, size in data_files(m, p, world, rank)]
        files += [ShardFile(f"{ITEM}/ocdbt.process_{rank}/manifest.ocdbt", PROCESS_MANIFEST_BYTES, "metadata"),
                  _text(f"{ITEM}/array_metadatas/process_{rank}", array_metadatas(m, p, world, rank))]
        commit: tuple[ShardFile, ...] = ()
        if rank == 0:
            files.append(_text(f"{ITEM}/_sharding", sharding(m, world)))
            merged = sum(len(process_chunks(m, p, world, r)) for r in range(world)) * BTREE_ENTRY_BYTES
            done = b"Checkpoint commit was successful\n"
            commit = (ShardFile(f"{ITEM}/manifest.ocdbt", ROOT_MANIFEST_BYTES, "metadata"),
                      ShardFile(f"{ITEM}/d/{data_file_name(-1, 0)}", merged, "metadata"),
                      _text(f"{ITEM}/_METADATA", item_metadata(m)),
                      _text(f"{ITEM}/commit_success.txt", done),
                      _text("_CHECKPOINT_METADATA", checkpoint_metadata()),
                      _text("commit_success.txt", done))
        return RankPlan(rank, replica, 0, 0, fsdp_rank, tuple(files), commit)

    # -- loads ----------------------------------------------------------------
    def metadata_reads(self, m: ModelShape, p: Parallelism, job: LoadJob) -> list[ReadRange]:
        """What every process opens first: the step's and the item's metadata, the
        merged root manifest and B-tree (its leaves point into the process files)."""
        wanted = ("_CHECKPOINT_METADATA", f"{ITEM}/_METADATA", f"{ITEM}/manifest.ocdbt")
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
        return [replica * mesh.fsdp + f for replica in range(mesh.replicas) for f in fsdp]

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
    _, fsdp_rank = mesh.position(rank)
    places = _all_places(m, p, job.saved_ranks)
    out = []
    for i, leaf in enumerate(leaves(m)):
        if leaf.axis is None:
            shards = [0]
        else:
            per_new, per_old = leaf.shape[leaf.axis] // mesh.fsdp, leaf.shape[leaf.axis] // saved.fsdp
            lo, hi = fsdp_rank * per_new, (fsdp_rank + 1) * per_new
            shards = list(range(lo // per_old, (hi - 1) // per_old + 1))
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
