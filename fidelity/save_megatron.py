"""Saves the test model with the real Megatron-LM / Megatron-core code path, on CPU:
megatron.training.checkpointing.save_checkpoint (format torch_dist, fully parallel
save, distributed optimizer) on a GPTModel (local layer spec) wrapped as
Megatron-LM's get_model wraps it (Float16Module, then DistributedDataParallel),
with the DistributedOptimizer built by megatron.core.optimizer.get_megatron_optimizer.

    python fidelity/save_megatron.py --out OUT --world N [--tp T] [--overlap-grad-reduce]
    python fidelity/save_megatron.py --out OUT --world 2 --msc msc://ckpt/megatron

With --msc, Megatron-LM saves there with --enable-msc, through NVIDIA's
multi-storage-client: its profile (the URI's first part) an S3 provider on
AWS_ENDPOINT_URL, bucket ckpt, the environment's keys, written to
OUT/msc_config.json and named by MSC_CONFIG, as a job on an S3-compatible
store configures it (fidelity/record_requests.py records its requests).

The distributed optimizer's state is saved as Megatron-LM saves it by default
(distrib_optim_sharding_type dp_reshardable: one flat tensor per Adam state and
model-parallel position, chunked by parameter; --dist-ckpt-optim-fully-reshardable
gathers on the GPU and is not run here).

Megatron's training code assumes a GPU: the few CUDA calls on this path are
redirected to the CPU by the shims in `_cpu_shims` (each listed in info.json's
"hand_built"); everything that decides what is written, and how, is the library's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import warnings

from model import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS as NUM_LAYERS, VOCAB, shape  # noqa: E402 - the test shape
ITERATION = 1

HAND_BUILT = [
    "torch.cuda.current_device() returns 'cpu' (the DDP param/grad buffers, state_dict_saver's "
    "all-reduce of the failure flag), torch.cuda.synchronize() is a no-op (filesystem_async, fully_parallel)",
    "torch.cuda.get_rng_state/manual_seed and Megatron's _set_cuda_rng_state keep a 16-byte CPU "
    "Philox state (8-byte seed, 8-byte offset) as a CUDA generator does; torch.cuda.device_count() "
    "reports 1 while _set_random_seed runs so that the RNG tracker's states are created as on a GPU",
    "while get_megatron_optimizer runs: Tensor.type() of a CPU tensor reports its torch.cuda.* type and "
    "torch.tensor(..., device='cuda') allocates on the CPU (DistributedOptimizer/MixedPrecisionOptimizer "
    "check for CUDA parameter types and allocate a unit loss scale on the GPU)",
    "validate_args runs with get_device_arch_version() = 9 (Hopper) and CUDA_DEVICE_MAX_CONNECTIONS=1 "
    "(it asks the GPU its architecture when TP > 1)",
    "get_model's two GPU-only steps are skipped (model_module.cuda() and the CUDA stream around the DDP "
    "wrapping); the rest is called as get_model calls it (Float16Module, get_megatron_ddp_config, "
    "resolve_ddp_bucket_size, wrap_model_chunks_with_ddp)",
    "the one optimizer step before the save uses random gradients (N(0, 1e-3)) on the fp32 main-parameter "
    "shards and steps the inner torch AdamW directly (no forward/backward, no grad reduce-scatter, no "
    "param all-gather), so exp_avg/exp_avg_sq/step exist as after iteration 1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- CPU shims ---------------------------------------------------------------------------------
class _CudaRng:
    """A CUDA generator's state as torch.cuda.get_rng_state returns it: 16 bytes, seed then offset."""
    def __init__(self):
        self.state = self.make(0)

    @staticmethod
    def make(seed: int):
        import torch
        return torch.tensor(list(int(seed).to_bytes(8, "little") + (0).to_bytes(8, "little")), dtype=torch.uint8)


def _cpu_shims() -> None:
    import torch
    import megatron.core.tensor_parallel.random as mrandom
    rng = _CudaRng()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: rng.state.clone()
    torch.cuda.set_rng_state = lambda state, *a, **k: setattr(rng, "state", state.clone())
    torch.cuda.manual_seed = lambda seed: setattr(rng, "state", _CudaRng.make(seed))
    torch.cuda.manual_seed_all = torch.cuda.manual_seed
    mrandom._set_cuda_rng_state = lambda state, *a, **k: setattr(rng, "state", state.clone())


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _cuda_types_on_cpu():
    """Tensor.type() of a CPU tensor names its CUDA type; torch.tensor(device='cuda') allocates on the CPU."""
    import torch
    real_type, real_tensor = torch.Tensor.type, torch.tensor

    def type_(self, dtype=None, non_blocking=False, **kw):
        if dtype is None and not kw and self.device.type == "cpu":
            return real_type(self).replace("torch.", "torch.cuda.", 1)
        return real_type(self, dtype, non_blocking, **kw)

    def tensor(*a, **k):
        if str(k.get("device", "")).startswith("cuda"):
            k["device"] = "cpu"
        return real_tensor(*a, **k)

    with _patched(torch.Tensor, "type", type_), _patched(torch, "tensor", tensor):
        yield


# -- the save ------------------------------------------------------------------------------------
def _megatron_argv(opts) -> list[str]:
    """Megatron-LM's command line for this model (pretrain_gpt.py style)."""
    argv = ["--num-layers", str(NUM_LAYERS), "--hidden-size", str(HIDDEN), "--ffn-hidden-size", str(FFN),
            "--num-attention-heads", str(HEADS), "--group-query-attention", "--num-query-groups", str(KV_HEADS),
            "--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
            "--position-embedding-type", "rope", "--no-rope-fusion", "--disable-bias-linear",
            "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "128", "--tokenizer-type", "NullTokenizer",
            "--seq-length", "128", "--max-position-embeddings", "128",
            "--micro-batch-size", "1", "--global-batch-size", str(opts.world // opts.tp),
            "--bf16", "--use-distributed-optimizer", "--optimizer", "adam", "--lr", "1e-4",
            "--train-iters", "10", "--save-interval", "1", "--save", opts.msc or os.path.join(opts.out, "ckpt"),
            "--ckpt-format", "torch_dist", "--transformer-impl", "local", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
            "--no-masked-softmax-fusion", "--no-bias-swiglu-fusion", "--use-cpu-initialization",
            "--tensor-model-parallel-size", str(opts.tp), "--pipeline-model-parallel-size", "1",
            "--seed", "1234"]
    if opts.overlap_grad_reduce:
        argv.append("--overlap-grad-reduce")
    if opts.msc:
        argv.append("--enable-msc")
    return argv


def _msc_config(opts) -> None:
    """multi-storage-client's profile for --msc's URI: an S3 provider on AWS_ENDPOINT_URL."""
    profile = opts.msc[len("msc://"):].split("/", 1)[0]
    config = {"profiles": {profile: {
        "storage_provider": {"type": "s3", "options": {"base_path": "ckpt", "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
                                                       "region_name": os.environ.get("AWS_REGION", "us-east-1")}},
        "credentials_provider": {"type": "S3Credentials", "options": {
            "access_key": os.environ["AWS_ACCESS_KEY_ID"], "secret_key": os.environ["AWS_SECRET_ACCESS_KEY"]}}}}}
    path = os.path.join(opts.out, "msc_config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    os.environ["MSC_CONFIG"] = path


def _worker(rank: int, opts) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(opts.port), RANK=str(rank),
                      WORLD_SIZE=str(opts.world), LOCAL_RANK="0")
    import torch
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=opts.world)
    _cpu_shims()

    from megatron.core import parallel_state as mpu
    from megatron.core.enums import ModelType  # noqa: F401 - as get_model imports it
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from megatron.core import tensor_parallel
    from megatron.training import global_vars
    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.checkpointing import save_checkpoint
    from megatron.training.initialize import _set_random_seed
    from megatron.training.training import (get_megatron_ddp_config, get_megatron_optimizer_config,
                                            get_optimizer_param_scheduler, resolve_ddp_bucket_size,
                                            wrap_model_chunks_with_ddp)
    from megatron.training.vocab_utils import calculate_padded_vocab_size

    import megatron.training.arguments as margs
    sys.argv = ["pretrain_gpt.py"] + _megatron_argv(opts)
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # as Megatron-LM's launch scripts set it for TP > 1
    args = parse_args()
    with _patched(margs, "get_device_arch_version", lambda: 9):  # a Hopper GPU
        validate_args(args)
    args.padded_vocab_size = calculate_padded_vocab_size(args.vocab_size, args.make_vocab_size_divisible_by,
                                                         args.tensor_model_parallel_size, logging_enabled=False)
    global_vars.set_args(args)

    mpu.initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                                  create_gloo_process_groups=args.use_gloo_process_groups,
                                  order='tp-cp-ep-dp-pp')
    with _patched(torch.cuda, "device_count", lambda: 1):
        _set_random_seed(args.seed, args.data_parallel_random_init, args.te_rng_tracker,
                         args.inference_rng_tracker)

    # get_model(model_provider) as pretrain_gpt's provider builds the local-spec GPTModel
    config = core_transformer_config_from_args(args)
    spec = get_gpt_layer_local_spec(args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
                                    args.multi_latent_attention, normalization=args.normalization)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                   max_sequence_length=args.max_position_embeddings, pre_process=True, post_process=True,
                   fp16_lm_cross_entropy=args.fp16_lm_cross_entropy, parallel_output=True,
                   share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                   position_embedding_type=args.position_embedding_type,
                   rotary_percent=args.rotary_percent, rotary_base=args.rotary_base)
    model = [gpt]
    for module in model:
        for param in module.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    num_parameters = sum(p.nelement() for module in model for p in module.parameters())
    model = [Float16Module(config, module) for module in model]
    ddp_config = get_megatron_ddp_config(args)
    ddp_config.bucket_size = resolve_ddp_bucket_size(ddp_config, mpu.get_data_parallel_group(with_context_parallel=True),
                                                     ddp_config.overlap_grad_reduce, num_parameters)
    model = wrap_model_chunks_with_ddp(model, config, ddp_config, bucket_sizes=[ddp_config.bucket_size],
                                       disable_bucketing_per_chunk=[False])

    opt_config, overrides = get_megatron_optimizer_config(args)
    with _cuda_types_on_cpu():
        optimizer = get_megatron_optimizer(opt_config, model, config_overrides=overrides,
                                           use_gloo_process_groups=args.use_gloo_process_groups)
    opt_param_scheduler = get_optimizer_param_scheduler(optimizer)

    # iteration 1's optimizer step: random gradients on this rank's fp32 main-parameter shards
    inners = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    gen = torch.Generator().manual_seed(1000 + rank)
    for inner in inners:
        for group in inner.param_groups:
            for p in group["params"]:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 1e-3
        inner.step()
        inner.zero_grad()
    opt_param_scheduler.step(increment=args.global_batch_size)
    args.consumed_train_samples = args.global_batch_size
    args.iteration = ITERATION

    buckets = [len(b.buckets) for m in model for b in m.buffers]
    save_checkpoint(ITERATION, model, optimizer, opt_param_scheduler,
                    num_floating_point_operations_so_far=0, checkpointing_context={})
    torch.distributed.barrier()
    if rank == 0:
        _write_info(opts, args, ddp_config, buckets, num_parameters)
    torch.distributed.destroy_process_group()


def _write_info(opts, args, ddp_config, buckets, num_parameters) -> None:
    from importlib.metadata import version
    info = {
        "library": "megatron-core", "version": version("megatron-core"),
        "libraries": {"torch": version("torch"),
                      **({"multi-storage-client": version("multi-storage-client")} if opts.msc else {})},
        "layout": "megatron",
        "variant": f"tp{opts.tp}-dp{opts.world // opts.tp}" + ("-overlap-grad-reduce" if opts.overlap_grad_reduce else ""),
        "writer": "megatron.training.checkpointing.save_checkpoint(1, model, optimizer, opt_param_scheduler, 0, "
                  "checkpointing_context={}) with Megatron-LM's parsed and validated arguments (--ckpt-format "
                  "torch_dist, --use-distributed-optimizer, fully parallel save by default), i.e. "
                  "dist_checkpointing.save with FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy(), "
                  "the data-parallel group), then the tracker file written by rank 0",
        "shape": shape("bf16", "fp32"),
        "parallelism": {"tensor": opts.tp, "pipeline": 1, "data": opts.world // opts.tp, "zero_stage": 1,
                        "devices_per_process": 1, "distrib_optim_sharding_type": "dp_reshardable",
                        "ckpt_fully_parallel_save": args.ckpt_fully_parallel_save,
                        "overlap_grad_reduce": bool(opts.overlap_grad_reduce),
                        "ddp_bucket_size": ddp_config.bucket_size, "buckets_per_buffer": buckets,
                        "padded_vocab_size": args.padded_vocab_size,
                        "parameters_per_model_parallel_rank": num_parameters},
        "world_size": opts.world, "step": ITERATION, "checkpoint_dir": f"iter_{ITERATION:07d}",
        "hand_built": HAND_BUILT,
    }
    with open(os.path.join(opts.out, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--overlap-grad-reduce", action="store_true",
                    help="Megatron-LM's --overlap-grad-reduce: buckets of max(40M, 1M x DP) parameters")
    ap.add_argument("--msc", default="", help="save to this msc:// URI through multi-storage-client instead")
    opts = ap.parse_args(argv)
    if opts.world % opts.tp:
        ap.error("--world must be a multiple of --tp")
    opts.out = os.path.abspath(opts.out)
    os.makedirs(opts.out, exist_ok=True)  # OUT/ckpt and the iteration folder: Megatron-LM makes them
    if opts.msc:
        _msc_config(opts)
    opts.port = _free_port()
    import torch.multiprocessing as mp
    mp.start_processes(_worker, args=(opts,), nprocs=opts.world, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
