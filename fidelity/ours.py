"""Our save of the checkpoint a fidelity manifest describes (fidelity/manifests):
the same layout, shape, parallelism and world size, every rank's Checkpointer in
this one process, rank 0 last (it commits once the others' files are down, as
the real savers' rank 0 does). Run under strace by fidelity/compare.py, so
ours and the real library's operations are counted by one tool.

    python fidelity/ours.py MANIFEST ROOT"""
from __future__ import annotations

import json
import sys

from omegaconf import OmegaConf

from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import RunConfig, load_config

#: the manifest's parallelism keys that are our model.parallelism's
PARALLELISM = ("tensor", "pipeline", "zero_stage")


def workload(manifest: dict, root: str) -> dict:
    """Our workload sections for the manifest's save, written under `root`."""
    shape = manifest["shape"]
    par = manifest["parallelism"]
    transformer = {k: shape[k] for k in ("hidden_size", "ffn_hidden_size", "vocab_size", "num_attention_heads",
                                         "num_kv_heads")}
    datatypes = {k: shape[k] for k in ("model_datatype", "optimizer_datatype") if shape.get(k)}
    sections = {"model": {"num_layers": shape["num_layers"], **datatypes, "transformer": transformer,
                          "parallelism": {k: par[k] for k in PARALLELISM if k in par}},
                "checkpoint": {"checkpoint_folder": root, "layout": manifest["layout"],
                               "num_checkpoints_write": 1, "num_checkpoints_read": 0,
                               **({"devices_per_rank": par["devices_per_process"]}
                                  if par.get("devices_per_process", 1) != 1 else {}),
                               **manifest.get("ours", {}).get("checkpoint", {})},
                "streaming": {"chunk_size": "1MiB", "pool_depth": 2, "gen_threads": 1,
                              **manifest.get("ours", {}).get("streaming", {})}}
    if "max_shard_size" in par:
        sections["model_load"] = {"max_shard_size": str(par["max_shard_size"])}
    return sections


def config(manifest: dict, root: str) -> RunConfig:
    return load_config(OmegaConf.create(workload(manifest, root)), manifest["world_size"])


def save(manifest: dict, root: str) -> None:
    cfg = config(manifest, root)
    world = manifest["world_size"]
    checkpointers = [Checkpointer(cfg, rank, world, world) for rank in range(world)]
    try:
        for ck in checkpointers:
            ck.prepare()
        for ck in checkpointers[1:] + checkpointers[:1]:
            ck.save(manifest["step"] or 1)
    finally:
        for ck in checkpointers:
            ck.close()


if __name__ == "__main__":
    save(json.load(open(sys.argv[1])), sys.argv[2])
