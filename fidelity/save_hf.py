"""Saves the test-shaped LLaMA as Hugging Face publishes weights: a
transformers LlamaForCausalLM built from a LlamaConfig of the test shape, cast to
bfloat16, then `model.save_pretrained(OUT/ckpt/model, max_shard_size=...)` in one
process. transformers 5 always writes safetensors (its safe_serialization
argument is gone); without --max-shard-size the library's default applies.

    python fidelity/save_hf.py --out /tmp/fid/safetensors-10MB-w1 --world 1 --max-shard-size 10MB
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

#: the test shape (our tests' scaled LLaMA)
from model import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, shape  # noqa: E402 - the test shape
CHECKPOINT_DIR = "model"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1, help="must be 1: one process saves")
    ap.add_argument("--max-shard-size", default=None, help="e.g. 10MB; omitted: save_pretrained's default")
    args = ap.parse_args(argv)
    if args.world != 1:
        ap.error("--world must be 1 (save_pretrained runs in one process)")

    import huggingface_hub
    import safetensors
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils.hub import convert_file_size_to_int

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    default = inspect.signature(LlamaForCausalLM.save_pretrained).parameters["max_shard_size"].default
    requested = args.max_shard_size if args.max_shard_size is not None else default
    kwargs = {} if args.max_shard_size is None else {"max_shard_size": args.max_shard_size}
    save_dir = os.path.join(args.out, "ckpt", CHECKPOINT_DIR)
    model.save_pretrained(save_dir, **kwargs)

    label = args.max_shard_size or "default"
    info = {
        "library": "transformers", "version": transformers.__version__,
        "libraries": {"safetensors": safetensors.__version__, "huggingface_hub": huggingface_hub.__version__,
                      "torch": torch.__version__.split("+")[0]},
        "layout": "safetensors", "variant": f"{label}-w1",
        "writer": f"transformers LlamaForCausalLM(LlamaConfig(test shape, tie_word_embeddings=False))"
                  f".to(bfloat16).save_pretrained('model'"
                  + (f", max_shard_size={args.max_shard_size!r}" if kwargs else "")
                  + f") in one process (max_shard_size {requested!r}; transformers 5 always writes safetensors).",
        "shape": shape("bf16", None),
        "parallelism": {"tensor": 1, "pipeline": 1, "zero_stage": 0, "devices_per_process": 1,
                        "max_shard_size": convert_file_size_to_int(requested),
                        "max_shard_size_arg": requested},
        "world_size": 1, "step": None, "checkpoint_dir": CHECKPOINT_DIR,
        "hand_built": [],
    }
    with open(os.path.join(args.out, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
