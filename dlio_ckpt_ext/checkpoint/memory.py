"""The memory a rank's settings commit it to, checked before anything is allocated.

The streaming engine holds a bounded amount whatever the checkpoint size:
the buffer pool, one scratch buffer for verification, and for S3 the parts
s3dlio holds per upload. A setting such as pool_depth=100000 would otherwise
allocate until the kernel refuses, with a message that names no setting.
"""
from __future__ import annotations

from dlio_ckpt_ext.config import RunConfig, parse_size
from dlio_ckpt_ext.errors import ConfigError

#: leave this share of the available memory to the OS, DLIO and Python
HEADROOM = 0.9
GiB = float(1 << 30)


def staging_bytes(cfg: RunConfig, comm_size: int) -> int:
    """The largest staging area any rank of an async run allocates: its whole
    share of a checkpoint, each file page-aligned (engine.staging)."""
    from dlio_ckpt_ext.engine.staging import aligned
    return max(sum(aligned(f.size) for f in cfg.layout.rank_plan(cfg.shape, cfg.parallelism, comm_size, r).files)
               for r in range(comm_size))


def rank_buffers(cfg: RunConfig, comm_size: int = 1) -> list[tuple[str, object, int]]:
    """(key, value, bytes) of everything a rank allocates for streaming."""
    st, c = cfg.streaming, cfg.checkpoint
    out = []
    if cfg.is_async and c.num_checkpoints_write:
        # the rank's whole state, plus the chunk its content is generated into
        # a tiered run stages each persistent save (its async path)
        key, value = (("workload.tiers.persistent_every", cfg.tiers.persistent_every) if cfg.has_tiers
                      else ("workload.checkpoint.async_mode", c.async_mode))
        out.append((key, value, staging_bytes(cfg, comm_size) + cfg.chunk_size))
    scheme = str(cfg.storage.storage_root).split("://", 1)[0] if cfg.storage.storage_type == "s3" else ""
    library = _library(cfg) if scheme == "s3" else _cloud_library(cfg, scheme) if scheme in ("az", "gs") else ""
    if library not in ("", "s3dlio"):
        return out + _library_buffers(cfg, library, comm_size)
    s3_parts, blocks = scheme == "s3", scheme in ("az", "gs")
    if cfg.has_tiers and c.num_checkpoints_write:
        # the local tier's own pool: the local saves fill it while a persist writes the staging area
        out.append(("workload.tiers.local_root", cfg.tiers.local_root, st.pool_depth * cfg.chunk_size))
    if c.num_checkpoints_write and not (s3_parts or blocks):  # filled in the writers' memory instead
        out.append(("workload.streaming.pool_depth", st.pool_depth, st.pool_depth * cfg.chunk_size))
    if c.num_checkpoints_read:
        # a pool buffer per request in flight (+2), or on object storage the GETs'
        # own bytes (one per request in flight, one being verified)
        lent = cfg.storage.storage_type == "s3"
        out.append(("workload.streaming.read_parallelism", cfg.read_parallelism,
                    (cfg.read_parallelism + (1 if lent else 2)) * cfg.read_size))
        if st.verify:
            out.append(("workload.streaming.verify", st.verify, cfg.read_size))
        if cfg.layout.shares(cfg.load_job(comm_size), c.share):
            # a window of the rank's own part, a request in flight each, and a piece received
            key, value = (("workload.model_load.pattern", cfg.model_load.pattern) if cfg.is_model_load
                          else ("workload.checkpoint.share", c.share))
            out.append((key, value, (cfg.read_parallelism + 1) * cfg.read_size))
    if s3_parts and c.num_checkpoints_write:
        opts = _object_options(cfg)
        part = parse_size("workload.storage.storage_options.part_size", opts.part_size)
        in_flight = opts.max_in_flight
        # s3dlio holds up to max_in_flight parts plus the two being filled and sent,
        # per object, for each object a rank uploads at once
        out.append(("workload.storage.storage_options.max_in_flight", in_flight,
                    part * (in_flight + 2) * cfg.concurrent_files))
    if blocks and c.num_checkpoints_write:
        from dlio_ckpt_ext.config import structured
        from dlio_ckpt_ext.storage.cloud import CloudOptions, blocks_in_flight
        opts = structured(CloudOptions, dict(cfg.storage.storage_options), "workload.storage.storage_options.")
        # a block uploading per block in flight and one being filled, per object open
        out.append(("workload.storage.storage_options.max_in_flight", opts.max_in_flight,
                    cfg.chunk_size * (blocks_in_flight(scheme, opts) + 1) * cfg.concurrent_files))
    return out


#: a file TensorStore sends is held this many times over (ours, the bytes it takes, its own)
TENSORSTORE_COPIES = 3


def _object_options(cfg: RunConfig):
    from dlio_ckpt_ext.config import structured
    from dlio_ckpt_ext.storage.objstore import ObjectOptions
    return structured(ObjectOptions, dict(cfg.storage.storage_options), "workload.storage.storage_options.")


def _library(cfg: RunConfig) -> str:
    from dlio_ckpt_ext.storage import libraries
    return libraries.resolve(_object_options(cfg).storage_library, cfg.checkpoint.layout)


def _cloud_library(cfg: RunConfig, scheme: str) -> str:
    from dlio_ckpt_ext.config import structured
    from dlio_ckpt_ext.storage import libraries
    from dlio_ckpt_ext.storage.cloud import CloudOptions
    opts = structured(CloudOptions, dict(cfg.storage.storage_options), "workload.storage.storage_options.")
    return libraries.resolve_cloud(scheme, opts.storage_library, cfg.checkpoint.layout)


def _library_buffers(cfg: RunConfig, library: str, comm_size: int) -> list[tuple[str, object, int]]:
    """What a rank holds streaming through a client library (storage/libraries/): the pool its
    writer copies from, where the library lends none, and what the library itself holds as its
    framework's writes and reads do: whole files (msc, TensorStore), parts uploading (minio)."""
    from dlio_ckpt_ext.storage.libraries import KEY, minio_client, msc, s3torch
    st, c = cfg.streaming, cfg.checkpoint
    out = []
    files = cfg.layout.rank_plan(cfg.shape, cfg.parallelism, comm_size, 0).files
    largest = max((f.size for f in files), default=0)
    if c.num_checkpoints_write:
        if library != "tensorstore":
            out.append(("workload.streaming.pool_depth", st.pool_depth, st.pool_depth * cfg.chunk_size))
        held = {"s3torchconnector": 2 * s3torch.PART_SIZE,  # a chunk copied in, a part the CRT sends
                "minio": (minio_client.parallel_uploads(comm_size) + 1) * minio_client.PART_SIZE
                + minio_client.PIPE_DEPTH * cfg.chunk_size,
                # the whole file until its upload on close, and the parts in flight past 64 MiB
                "msc": largest + (msc.MAX_CONCURRENCY * msc.MULTIPART_CHUNKSIZE
                                  if largest > msc.MULTIPART_THRESHOLD else 0),
                # each file whole, the bytes TensorStore takes and its own copy as the PUT goes:
                # 3.0x a 512 MiB file's size, measured (a 2 GiB file's rank peaked at 8.5 GiB)
                "tensorstore": TENSORSTORE_COPIES * largest * cfg.concurrent_files}[library]
        out.append((KEY, library, held))
    if c.num_checkpoints_read:
        # the GETs' own bytes, one per request in flight; multi-storage-client fetches each file
        # it opens whole when it is at most its memory_load_limit, a file a request in flight at most
        held = (cfg.read_parallelism + 1) * cfg.read_size
        if library == "msc" and largest <= msc.MEMORY_LOAD_LIMIT:
            held = max(held, min(cfg.read_parallelism, len(files)) * largest)
        out.append(("workload.streaming.read_parallelism", cfg.read_parallelism, held))
        if st.verify:
            out.append(("workload.streaming.verify", st.verify, cfg.read_size))
    return out


def _label(key: str) -> str:
    name = key.rsplit(".", 1)[-1]
    if name in ("async_mode", "persistent_every"):
        return "async staging (the rank's whole checkpoint share)"
    if name == "storage_library":
        return "the client library's own buffers"
    return "local tier buffers" if name == "local_root" else name


def available_bytes() -> int:
    """MemAvailable: what the node can give without swapping or evicting much."""
    import psutil
    return int(psutil.virtual_memory().available)


def check_memory(cfg: RunConfig, ranks_per_node: int, comm_size: int, available: int | None = None) -> int:
    """Refuse settings whose buffers, times the ranks on this node, do not fit
    the node's available memory; returns the bytes one rank needs."""
    available = available_bytes() if available is None else available
    parts = rank_buffers(cfg, comm_size)
    per_rank = sum(n for _, _, n in parts)
    if per_rank * ranks_per_node > HEADROOM * available:
        key, value, _ = max(parts, key=lambda p: p[2])
        detail = " + ".join(f"{_label(k)} {n / GiB:.2f} GiB" for k, _, n in parts)
        raise ConfigError(key, value, f"settings whose buffers fit this node: {detail} = {per_rank / GiB:.2f} GiB "
                          f"per rank x {ranks_per_node} rank(s) on this node = {per_rank * ranks_per_node / GiB:.2f} "
                          f"GiB, more than {HEADROOM:.0%} of the {available / GiB:.2f} GiB available")
    return per_rank
