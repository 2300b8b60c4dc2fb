"""Saves the test-shaped LLaMA with torch.distributed.checkpoint as torchtitan's
CheckpointManager does: every transformer block and the root wrapped with FSDP2's
fully_shard (gloo, CPU, fp32), one AdamW step so Adam's moments exist, then on
every rank `dcp.save({"model": ..., "optimizer": ...}, checkpoint_id=OUT/ckpt/step-1)`
with the default FileSystemWriter (synchronous). The model state dict comes from
get_model_state_dict, the optimizer's from get_optimizer_state_dict with
flatten_optimizer_state_dict=True (torchtitan's ModelWrapper and OptimizersContainer).

    python fidelity/save_dcp.py --out /tmp/fid/dcp-fsdp2-w2 --world 2
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from batch import every_token

#: the test shape (our tests' scaled LLaMA)
LAYERS, HIDDEN, FFN, VOCAB, HEADS, KV_HEADS = 2, 512, 1792, 8192, 8, 2
STEP = 1


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.wq = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, HIDDEN, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, HEADS, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, KV_HEADS, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, KV_HEADS, self.head_dim).transpose(1, 2)
        rep = HEADS // KV_HEADS
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """torchtitan's TransformerBlock: its submodules in its registration order."""

    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.feed_forward = FeedForward()
        self.attention_norm = nn.RMSNorm(HIDDEN)
        self.ffn_norm = nn.RMSNorm(HIDDEN)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """torchtitan's llama3 Transformer's parameters and names (no RoPE: it has no parameters)."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def worker(rank: int, world: int, port: int, root: str) -> None:
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
        model = Transformer()
        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1)

        tokens = every_token(VOCAB, rank)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        state = {"model": get_model_state_dict(model),
                 "optimizer": get_optimizer_state_dict(
                     model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))}
        dcp.save(state, checkpoint_id=os.path.join(root, f"step-{STEP}"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1)
    args = ap.parse_args(argv)
    root = os.path.join(args.out, "ckpt")  # made by DCP's FileSystemWriter (mkdir parents=True), not here

    import torch.multiprocessing as mp
    mp.start_processes(worker, args=(args.world, free_port(), root), nprocs=args.world, start_method="spawn")

    info = {
        "library": "torch", "version": torch.__version__.split("+")[0], "libraries": {},
        "layout": "dcp", "variant": f"fsdp2-w{args.world}",
        "writer": "torch.distributed.checkpoint.save({'model': get_model_state_dict(m), 'optimizer': "
                  "get_optimizer_state_dict(m, opt, flatten_optimizer_state_dict=True)}, checkpoint_id=step-1) "
                  "on every rank, default FileSystemWriter (synchronous), after one AdamW step of a "
                  "model with every block and the root wrapped by FSDP2 fully_shard (gloo, CPU, fp32).",
        "shape": {"num_layers": LAYERS, "hidden_size": HIDDEN, "ffn_hidden_size": FFN, "vocab_size": VOCAB,
                  "num_attention_heads": HEADS, "num_kv_heads": KV_HEADS,
                  "model_datatype": "fp32", "optimizer_datatype": "fp32"},
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
