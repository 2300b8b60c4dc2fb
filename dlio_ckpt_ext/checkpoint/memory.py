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
        from dlio_ckpt_ext.config import structured
        from dlio_ckpt_ext.storage.objstore import ObjectOptions
        prefix = "workload.storage.storage_options."
        opts = structured(ObjectOptions, dict(cfg.storage.storage_options), prefix)
        part = parse_size(prefix + "part_size", opts.part_size)
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


def _label(key: str) -> str:
    name = key.rsplit(".", 1)[-1]
    if name in ("async_mode", "persistent_every"):
        return "async staging (the rank's whole checkpoint share)"
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
