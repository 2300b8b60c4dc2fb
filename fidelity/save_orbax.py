"""Saves the test model's MaxText-like train state with the real Orbax, as MaxText
saves it, for fidelity/record.py:

    python fidelity/save_orbax.py --out OUT --world N [--devices-per-process D] [--shard-axis largest|embed]
        [--s3 s3://bucket/prefix]

MaxText's checkpointing.py (the Orbax v0 path: create_orbax_checkpoint_manager and
save_checkpoint) makes a CheckpointManager with item_names ("items",), the
"items" handler PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True) and
CheckpointManagerOptions(create=True, save_interval_steps=..., enable_async_checkpointing=
config.async_checkpointing, True by default), then saves
Composite(items=PyTreeSave(state, save_args=SaveArgs(chunk_byte_size=2 GiB) a leaf,
ocdbt_target_data_file_size=2 GiB)). This script does the same at step 1.

The state is fp32 (MaxText's default weight_dtype) and laid out as MaxText's
TrainState (scan_layers: the layers stacked on axis 1): step, params
({"params": {...}}) and optax.adamw's state (ScaleByAdamState(count, mu, nu),
EmptyState(), ScaleByScheduleState(count)). Neither flax nor optax is installed in
the harness's venv: the TrainState and the optimizer state are built by hand with
the same pytree structure and key names.

Every array is sharded (FSDP) over a 1-D mesh "fsdp" of all devices of all
processes: by default on its largest axis the mesh size divides (--shard-axis
largest), or on the axis MaxText's logical rules give FSDP, "embed", with the
norms replicated (--shard-axis embed). The script launches its N processes
itself (jax.distributed on 127.0.0.1, gloo CPU collectives); D devices a process
come from XLA_FLAGS=--xla_force_host_platform_device_count=D. No GPU needed.

With --s3, the arrays go to that prefix through TensorStore's own `s3` kvstore
(for fidelity/record_requests.py). Orbax 0.12 has no s3:// path: its directories
go through etils' epath and its kvstores are `file` or `gcs`. So the save runs
as above on a local directory, with one change in Orbax: every OCDBT kvstore
spec it builds (`build_kvstore_tspec`: each process's `ocdbt.process_N`, the
merged `items/`) has its base on TensorStore's s3 driver at the same relative
path, with the read coalescing Orbax adds for remote storage, and Orbax
commits as it does on GCS (`CommitFileTemporaryPath`: in place, no rename).
Orbax's own transactions, concurrency, OCDBT settings and merge are untouched;
its epath files (_METADATA, _sharding, commit_success.txt, ...) stay local.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import subprocess
import sys
import time

from model import free_port, shape  # noqa: E402 - the test shape

STEP = 1
CHUNK_BYTES = 2 * 1024 ** 3   # MaxText's DEFAULT_OCDBT_TARGET_DATA_FILE_SIZE / checkpoint_storage_target_data_file_size_bytes
SHAPE = shape("fp32", "fp32")  # MaxText's weight_dtype float32, Adam's moments fp32


def param_specs() -> list[tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]]:
    """(keypath below params["params"], shape, MaxText's logical axis names) of each weight."""
    s = SHAPE
    h, f, v, L = s["hidden_size"], s["ffn_hidden_size"], s["vocab_size"], s["num_layers"]
    heads, kv = s["num_attention_heads"], s["num_kv_heads"]
    hd = h // heads
    lay = ("decoder", "layers")
    return [
        (("token_embedder", "embedding"), (v, h), ("vocab", "embed")),
        (lay + ("pre_self_attention_layer_norm", "scale"), (h, L), ("norm", "layers")),
        (lay + ("self_attention", "query", "kernel"), (h, L, heads, hd), ("embed", "layers", "q_heads", "kv")),
        (lay + ("self_attention", "key", "kernel"), (h, L, kv, hd), ("embed", "layers", "kv_heads", "kv_head_dim")),
        (lay + ("self_attention", "value", "kernel"), (h, L, kv, hd), ("embed", "layers", "kv_heads", "kv_head_dim")),
        (lay + ("self_attention", "out", "kernel"), (heads, L, hd, h), ("heads", "layers", "kv", "embed")),
        (lay + ("post_self_attention_layer_norm", "scale"), (h, L), ("norm", "layers")),
        (lay + ("mlp", "wi_0", "kernel"), (h, L, f), ("embed", "layers", "mlp")),
        (lay + ("mlp", "wi_1", "kernel"), (h, L, f), ("embed", "layers", "mlp")),
        (lay + ("mlp", "wo", "kernel"), (f, L, h), ("mlp", "layers", "embed")),
        (("decoder", "decoder_norm", "scale"), (h,), ("norm",)),
        (("decoder", "logits_dense", "kernel"), (h, v), ("embed", "vocab")),
    ]


def shard_axis(shape, axes, n: int, rule: str):
    """The axis FSDP shards, or None (replicated)."""
    if not shape:
        return None
    if rule == "embed":
        return axes.index("embed") if "embed" in axes and shape[axes.index("embed")] % n == 0 else None
    fits = [a for a in range(len(shape)) if shape[a] % n == 0]
    return max(fits, key=lambda a: (shape[a], -a)) if fits else None


# --------------------------------------------------------------------------- worker
def s3_spec(uri: str, rel: str) -> dict:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return {"driver": "s3", "bucket": bucket, "path": f"{prefix}/{rel}".strip("/") + "/",
            "endpoint": os.environ["AWS_ENDPOINT_URL"], "aws_region": os.environ.get("AWS_REGION", "us-east-1"),
            "aws_credentials": {"type": "environment"}}


def ocdbt_on_s3(local_root: str, uri: str) -> None:
    """Orbax's OCDBT kvstores on TensorStore's s3 driver (see the docstring)."""
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
    build = ts_utils.build_kvstore_tspec

    def on_s3(directory, name=None, *, use_ocdbt=True, process_id=None, replica_separate_folder=False):
        spec = build(directory, name, use_ocdbt=use_ocdbt, process_id=process_id,
                     replica_separate_folder=replica_separate_folder)
        if not use_ocdbt:
            return spec
        # the merge finds the processes' databases by globbing the local directory
        os.makedirs(spec["base"]["path"], exist_ok=True)
        out = {k: v for k, v in spec.items() if k not in ("base", "manifest")}
        out["base"] = s3_spec(uri, os.path.relpath(spec["base"]["path"], local_root))
        out.update({"experimental_read_coalescing_threshold_bytes": 1000000,   # Orbax's, for remote storage
                    "experimental_read_coalescing_merged_bytes": 500000000000,
                    "experimental_read_coalescing_interval": "1ms"})
        return out

    ts_utils.build_kvstore_tspec = on_s3


def worker(args) -> None:
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.world > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.world,
                                   process_id=args.rank)
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = np.array(jax.devices())
    assert devices.size == args.world * args.devices_per_process, (devices.size, args.world)
    mesh = Mesh(devices, ("fsdp",))
    n = devices.size

    def array(shape, axes, seed: int, make):
        ax = shard_axis(shape, axes, n, args.shard_axis)
        spec = [None] * len(shape)
        if ax is not None:
            spec[ax] = "fsdp"
        full = make(np.random.default_rng(seed), shape)
        return jax.make_array_from_callback(shape, NamedSharding(mesh, P(*spec)), lambda idx: full[idx])

    def nest(items):
        out: dict = {}
        for path, value in items:
            d = out
            for k in path[:-1]:
                d = d.setdefault(k, {})
            d[path[-1]] = value
        return out

    weights = lambda rng, shape: (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    first = lambda rng, shape: (rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-4))
    # Adam's second moment: an average of squared gradients (std 1e-4), as bench/zstd_ratio.py models it
    second = lambda rng, shape: (rng.chisquare(20, shape) / 20 * 1e-8).astype(np.float32)
    specs = param_specs()
    tree = lambda make, base: {"params": nest([(p, array(s, a, base + i, make)) for i, (p, s, a) in enumerate(specs)])}
    scalar = lambda v: array((), (), 0, lambda rng, shape: np.asarray(v, dtype=np.int32))

    @dataclasses.dataclass
    class ScaleByAdamState:             # optax.ScaleByAdamState's fields
        count: object
        mu: object
        nu: object

    @dataclasses.dataclass
    class EmptyState:                   # optax.EmptyState (add_decayed_weights): no leaves
        pass

    @dataclasses.dataclass
    class ScaleByScheduleState:         # optax.ScaleByScheduleState (scale_by_learning_rate with a schedule)
        count: object

    @dataclasses.dataclass
    class TrainState:                   # flax.training.train_state.TrainState's pytree fields
        step: object
        params: object
        opt_state: object

    for cls, fields in ((ScaleByAdamState, ["count", "mu", "nu"]), (EmptyState, []),
                        (ScaleByScheduleState, ["count"]), (TrainState, ["step", "params", "opt_state"])):
        jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])

    state = TrainState(step=scalar(STEP),
                       params=tree(weights, 100),
                       opt_state=(ScaleByAdamState(count=scalar(STEP), mu=tree(first, 200), nu=tree(second, 300)),
                                  EmptyState(), ScaleByScheduleState(count=scalar(STEP))))
    jax.block_until_ready(state)

    extra = {}
    if args.s3:
        ocdbt_on_s3(args.root, args.s3)
        from orbax.checkpoint._src.path.atomicity import CommitFileTemporaryPath
        extra["temporary_path_class"] = CommitFileTemporaryPath
    manager = ocp.CheckpointManager(
        args.root,
        item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
        options=ocp.CheckpointManagerOptions(create=True, save_interval_steps=1,
                                             enable_async_checkpointing=not args.sync, **extra),
    )
    save = ocp.args.PyTreeSave(item=state,
                               save_args=jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), state),
                               ocdbt_target_data_file_size=CHUNK_BYTES)
    t = time.time()
    manager.save(STEP, args=ocp.args.Composite(items=save))
    manager.wait_until_finished()
    manager.close()
    print(f"process {args.rank}: saved step {STEP} in {time.time() - t:.2f}s on {n} devices", flush=True)
    if args.world > 1:
        jax.distributed.shutdown()


# --------------------------------------------------------------------------- launcher
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1, help="processes")
    ap.add_argument("--devices-per-process", type=int, default=1)
    ap.add_argument("--shard-axis", choices=("largest", "embed"), default="embed")
    ap.add_argument("--sync", action="store_true", help="enable_async_checkpointing=False (MaxText's default is async)")
    ap.add_argument("--s3", default="", help="the arrays to this s3://bucket/prefix through TensorStore's s3 kvstore")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.root = os.path.join(os.path.abspath(args.out), "ckpt")
    if args.worker is not None:
        args.rank = args.worker
        worker(args)
        return 0

    os.makedirs(args.root, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices_per_process}")
    port = free_port()
    base = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--world", str(args.world),
            "--devices-per-process", str(args.devices_per_process), "--shard-axis", args.shard_axis,
            "--port", str(port)] + (["--sync"] if args.sync else []) + (["--s3", args.s3] if args.s3 else [])
    procs = [subprocess.Popen(base + ["--worker", str(r)], env=env) for r in range(args.world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"worker exit codes {codes}", file=sys.stderr)
        return 1

    d, w = args.devices_per_process, args.world
    info = {
        "library": "orbax-checkpoint", "version": md.version("orbax-checkpoint"),
        "libraries": {k: md.version(k) for k in ("tensorstore", "jax", "jaxlib", "numpy")},
        "layout": "orbax", "variant": f"d{d}-w{w}" + ("" if args.shard_axis == "embed" else "-largest")
                                      + ("-sync" if args.sync else "") + ("-s3" if args.s3 else ""),
        "writer": ("each of the processes made ocp.CheckpointManager(OUT/ckpt, item_names=('items',), item_handlers="
                   "{'items': PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)}, options="
                   f"CheckpointManagerOptions(create=True, save_interval_steps=1, enable_async_checkpointing="
                   f"{not args.sync})) and called save({STEP}, args=Composite(items=PyTreeSave(state, save_args="
                   "SaveArgs(chunk_byte_size=2 GiB) per leaf, ocdbt_target_data_file_size=2 GiB))) then "
                   "wait_until_finished(), as MaxText's checkpointing.py (Orbax v0 path) does"),
        "shape": SHAPE,
        "parallelism": {"tensor": 1, "pipeline": 1, "zero_stage": 3, "devices_per_process": d, "replicas": 1,
                        "fsdp": d * w, "mesh": {"fsdp": d * w},
                        "shard_axis": ("largest axis the mesh size divides" if args.shard_axis == "largest"
                                       else "MaxText's 'embed' axis, norms replicated"),
                        "scan_layers": True},
        "world_size": w, "step": STEP, "checkpoint_dir": str(STEP),
        "hand_built": [
            "optax is not installed: the optimizer state is a hand-built pytree with optax.adamw's structure "
            "(ScaleByAdamState(count, mu, nu), EmptyState(), ScaleByScheduleState(count)), mu random normal "
            "(std 1e-4) and nu the mean of 20 squared normals (std 1e-4), not computed by optax",
            "flax is not installed: the train state is a hand-built dataclass with flax TrainState's pytree "
            "fields (step, params={'params': ...}, opt_state), keys as MaxText saves them",
            "the weights are random normal (std 0.02) fp32, not trained",
        ],
    }
    with open(os.path.join(args.out, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
