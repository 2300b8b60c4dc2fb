"""Saves the test-shaped LLaMA with torch.distributed.checkpoint as torchtitan's
CheckpointManager does: every transformer block and the root wrapped with FSDP2's
fully_shard (gloo, CPU, fp32), one AdamW step so Adam's moments exist, then on
every rank `dcp.save({"model": ..., "optimizer": ...}, checkpoint_id=OUT/ckpt/step-1)`
with the default FileSystemWriter (synchronous). The model state dict comes from
get_model_state_dict, the optimizer's from get_optimizer_state_dict with
flatten_optimizer_state_dict=True (torchtitan's ModelWrapper and OptimizersContainer).

    python fidelity/save_dcp.py --out /tmp/fid/dcp-fsdp2-w2 --world 2
    python fidelity/save_dcp.py --out /tmp/fid/dcp-s3 --world 2 --s3 s3://ckpt/dcp

With --s3, the save goes to that prefix through s3torchconnector's
S3StorageWriter (its defaults: 8 MiB parts, thread_count 1, the default
prefix strategy), its client pointed at AWS_ENDPOINT_URL (path style), as a
torchtitan job on an S3-compatible store configures it
(fidelity/record_requests.py records its requests).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import version

import torch

from model import VOCAB, every_token, free_port, llama, shape

STEP = 1


def s3_writer(uri: str):
    """s3torchconnector's DCP writer for `uri`, its client on AWS_ENDPOINT_URL."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    region = os.environ.get("AWS_REGION", "us-east-1")
    config = S3ClientConfig(force_path_style=True)
    writer = S3StorageWriter(region, uri, s3client_config=config)
    # the writer's constructor takes no endpoint: the same file system, its client on the local server
    writer.fs = S3FileSystem(region, s3_client=S3Client(region, endpoint=os.environ["AWS_ENDPOINT_URL"],
                                                        s3client_config=config))
    return writer


def worker(rank: int, world: int, port: int, root: str, s3: str = "") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = llama()
        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1)

        tokens = every_token(VOCAB, rank)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad()

        state = {"model": get_model_state_dict(model),
                 "optimizer": get_optimizer_state_dict(
                     model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))}
        if s3:
            dcp.save(state, storage_writer=s3_writer(f"{s3}/step-{STEP}"))
        else:
            dcp.save(state, checkpoint_id=os.path.join(root, f"step-{STEP}"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--s3", default="", help="save to this s3:// prefix through s3torchconnector instead")
    args = ap.parse_args(argv)
    root = os.path.join(args.out, "ckpt")  # made by DCP's FileSystemWriter (mkdir parents=True), not here

    import torch.multiprocessing as mp
    mp.start_processes(worker, args=(args.world, free_port(), root, args.s3), nprocs=args.world,
                       start_method="spawn")

    info = {
        "library": "torch", "version": torch.__version__.split("+")[0],
        "libraries": {"s3torchconnector": version("s3torchconnector")} if args.s3 else {},
        "layout": "dcp", "variant": f"fsdp2-w{args.world}",
        "writer": "torch.distributed.checkpoint.save({'model': get_model_state_dict(m), 'optimizer': "
                  "get_optimizer_state_dict(m, opt, flatten_optimizer_state_dict=True)}, checkpoint_id=step-1) "
                  "on every rank, default FileSystemWriter (synchronous), after one AdamW step of a "
                  "model with every block and the root wrapped by FSDP2 fully_shard (gloo, CPU, fp32).",
        "shape": shape("fp32", "fp32"),
        "parallelism": {"tensor": 1, "pipeline": 1, "zero_stage": 3, "devices_per_process": 1,
                        "data": args.world, "fsdp": "fully_shard per block and root"},
        "world_size": args.world, "step": STEP, "checkpoint_dir": f"step-{STEP}",
        "hand_built": ["The model module is our own LLaMA-like nn.Module with torchtitan's parameter names, "
                       "shapes and registration order (not torchtitan's code; no RoPE buffer, which torchtitan "
                       "keeps non-persistent).",
                       "The saved state holds only 'model' and 'optimizer'; torchtitan's CheckpointManager also "
                       "saves train_state, lr_scheduler and dataloader entries (small byte items)."],
    }
    with open(os.path.join(args.out, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
