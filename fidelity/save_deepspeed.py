"""Saves the test shape with the real DeepSpeed (CPU accelerator, gloo): a small
LLaMA-like module under ZeRO-1 or ZeRO-3 with bf16 and AdamW, one
forward/backward/step, then engine.save_checkpoint(OUT/ckpt) with DeepSpeed's
default tag (global_step1).

    python fidelity/save_deepspeed.py --out /tmp/fid/deepspeed-zero1-w2 --world 2 --stage 1

Writes OUT/ckpt/{latest, zero_to_fp32.py, zero_to_torch.py, global_step1/...}
and OUT/info.json (the contract fidelity/record.py reads)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from model import VOCAB, every_token, free_port, llama, shape


def ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }


def worker(rank: int, world: int, port: int, out: str, stage: int) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "DS_ACCELERATOR": "cpu"})
    import torch
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = ds_config(stage)
    if stage == 3:
        # ZeRO-3 partitions the parameters as they are created
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = llama()
    else:
        model = llama()
    n = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    tokens = every_token(VOCAB, rank)
    loss = engine(tokens[:, :-1], tokens[:, 1:])
    engine.backward(loss)
    engine.step()
    assert engine.global_steps == 1, engine.global_steps
    engine.save_checkpoint(os.path.join(out, "ckpt"))  # default tag: global_step{global_steps}
    if rank == 0:
        write_info(out, world, stage, n, engine)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def write_info(out: str, world: int, stage: int, n: int, engine) -> None:
    from importlib.metadata import version
    info = {
        "library": "deepspeed", "version": version("deepspeed"),
        "libraries": {"torch": version("torch")},
        "layout": "deepspeed", "variant": f"zero{stage}-bf16-adamw",
        "writer": (f"deepspeed.initialize (DS_ACCELERATOR=cpu, gloo, bf16, ZeRO stage {stage}, AdamW with "
                   "torch_adam) on the harness's LLaMA module (torchtitan's names), one forward/backward/step, then "
                   "engine.save_checkpoint(OUT/ckpt) with DeepSpeed's default tag global_step1."),
        "shape": shape("bf16", "fp32"),
        "parallelism": {"tensor": 1, "pipeline": 1, "zero_stage": stage, "devices_per_process": 1,
                        "data": world, "optimizer": type(engine.optimizer).__name__,
                        "parameters": n},
        "world_size": world, "step": 1, "checkpoint_dir": "global_step1", "hand_built": [],
    }
    with open(os.path.join(out, "info.json"), "w") as f:
        json.dump(info, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--stage", type=int, choices=(1, 3), default=1)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)  # OUT/ckpt itself is made by save_checkpoint
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch.multiprocessing as mp
    mp.start_processes(worker, args=(args.world, free_port(), args.out, args.stage), nprocs=args.world,
                       join=True, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
