"""Model loads: each pattern against the real loader it emulates, on the same
published shards, in one run.

    python bench/model_load_bench.py [--install] [--storage local,s3] [--pairs 4]
        [--json bench/results/model_load_bench.json]
    python bench/model_load_bench.py --ours-only --layers 1 --hidden 256 --shard-mb 4 --link ''  # CI's, no loaders

The real loaders are not our dependencies: `--install` puts them into this
Python's environment first (torch 2.13.0, which this machine's pip takes from
a CPU wheel on disk for Python 3.11; safetensors; runai-model-streamer and its
S3 part). The model (LLaMA 3 8B's shape scaled down by --layers/--hidden) is
published once by our Checkpointer (bf16 safetensors shards of --shard-mb MB
and the index), then one loading rank reads it, in interleaved pairs (A B /
B A, order-balanced ratio, bench/pairs.py):

- `safetensors` (vLLM's default loader) against the safetensors library as
  vLLM calls it: safe_open(framework="pt") on every shard, get_slice of
  each tensor the rank serves at --tensor-parallel (a column-parallel
  tensor's rows, the others whole), the page cache dropped before
  (posix_fadvise DONTNEED on every shard; ours reads with O_DIRECT);
- `runai` against runai-model-streamer's SafetensorsStreamer (its defaults:
  16 threads of 2 MiB reads on a file system, 8 MiB ranged GETs on S3), on the
  local disk and on SeaweedFS behind the emulated remote link (--link, default
  10 ms each way and 40 MB/s a connection: what a remote store serves, so the
  loader's own CPU on these 2 cores is not what is compared), where the
  server's own counters give both sides' ranged GETs.

Target: ours within 0.9-1.1x of the loader it emulates, and the same GETs on S3.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_servers import link_of, seaweedfs  # noqa: E402
from bench_table import BenchTable  # noqa: E402
from pairs import OrderedRatios, check_pairs  # noqa: E402

LOADERS = ["torch==2.13.0", "safetensors==0.8.0", "runai-model-streamer", "runai-model-streamer-s3"]
BUCKET = "modelbench"
GiB = float(1 << 30)


def install() -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *LOADERS], check=True)


def config(args, root: str, storage_type: str, ranks: int, pattern: str = "safetensors", tensor: int = 0,
           **checkpoint):
    from omegaconf import OmegaConf
    from dlio_ckpt_ext.config import load_config
    return load_config(OmegaConf.create({
        "model": {"num_layers": args.layers, "model_datatype": "bf16",
                  "parallelism": {"tensor": tensor or args.tensor_parallel, "pipeline": 1},
                  "transformer": {"hidden_size": args.hidden, "ffn_hidden_size": args.hidden * 7 // 2,
                                  "vocab_size": 128256, "num_attention_heads": 32, "num_kv_heads": 8}},
        "streaming": {"chunk_size": "16MiB"},
        "storage": {"storage_type": storage_type, "storage_root": root},
        "checkpoint": {"checkpoint_folder": "models", "layout": "safetensors", **checkpoint},
        "model_load": {"max_shard_size": f"{args.shard_mb}MB", "pattern": pattern}}), ranks)


def publish(args, root: str, storage_type: str) -> list[str]:
    """The model published by one rank: the shards' names."""
    from dlio_ckpt_ext import layouts
    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    cfg = config(args, root, storage_type, 1, tensor=1)  # the weights do not depend on how they are served
    ck = Checkpointer(cfg, 0, 1, 1)
    ck.prepare()
    ck.save(1)
    ck._save_generated(ck.directory(1), ck.rank_plan(0).commit_files, None, 1)
    ck.close()
    return [s.name for s in layouts.safetensors.published_shards(cfg.shape, cfg.parallelism)]


def ours(args, root: str, storage_type: str, pattern: str):
    """Our pattern's load, tensor-parallel rank 0's: a callable giving (seconds, bytes)."""
    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    cfg = config(args, root, storage_type, args.tensor_parallel, pattern, num_checkpoints_write=0,
                 num_checkpoints_read=1, saved_ranks=1)
    if args.reads:  # the loader's defaults replaced, to try others
        size, in_flight = args.reads.split(":")
        cfg.read_size, cfg.sections.model_load.read_parallelism = int(size) << 20, int(in_flight)
    ck = Checkpointer(cfg, 0, args.tensor_parallel, args.tensor_parallel)
    ck.prepare()

    def run() -> tuple[float, int]:
        t0 = time.perf_counter()
        n = sum(f.nbytes for f in ck.load(1))
        return time.perf_counter() - t0, n
    return run


def drop_cache(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def safetensors_library(args, folder: Path, shards: list[str]):
    """vLLM's default: every shard mapped, each tensor's slice of tensor-parallel rank 0 taken."""
    from safetensors import safe_open
    from dlio_ckpt_ext.shared_plans import safetensors_plan
    split = {t.name: t.split for t in safetensors_plan.hf_tensors(args.layers, args.hidden, args.hidden * 7 // 2,
                                                                    128256, 32, 8)}
    paths = [str(folder / s) for s in shards]

    def run() -> tuple[float, int]:
        drop_cache(paths)
        t0, n = time.perf_counter(), 0
        for path in paths:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    rows = sl.get_shape()[0]
                    if split[name] == "column" and args.tensor_parallel > 1:
                        t = sl[:-(-rows // args.tensor_parallel)]
                    else:
                        t = sl[:]
                    n += t.numel() * t.element_size()
        return time.perf_counter() - t0, n
    return run


def runai_streamer(paths: list[str], local: bool):
    from runai_model_streamer import SafetensorsStreamer

    def run() -> tuple[float, int]:
        if local:
            drop_cache(paths)
        t0, n = time.perf_counter(), 0
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(paths)
            for _, tensor in streamer.get_tensors():
                n += tensor.numel() * tensor.element_size()
        return time.perf_counter() - t0, n
    return run


def pairs(args, label: str, a, b, counts=None) -> dict:
    """ours (a) against the loader (b); counts(): the server's ranged GETs so far, when on S3."""
    def timed(side):
        before = counts() if counts else 0
        seconds, n = side()
        return seconds, n, (counts() - before) if counts else 0
    timed(a), timed(b)  # warm-up
    ratios = OrderedRatios()
    for i in range(args.pairs):
        first = i % 2 == 0
        if first:
            (ta, na, ga), (tb, nb, gb) = timed(a), timed(b)
        else:
            (tb, nb, gb), (ta, na, ga) = timed(b), timed(a)
        ratios.add(first, tb / ta)
        print(f"  {label}: pair {i + 1} ({'ours' if first else 'loader'} first): ours {na / GiB / ta:.3f} GiB/s "
              f"({na} bytes), loader {nb / GiB / tb:.3f} GiB/s ({nb} bytes)"
              + (f", ranged GETs ours {ga} loader {gb}" if counts else ""), flush=True)
    return {"ratio": ratios, "ours_bytes": na, "loader_bytes": nb, "gets": {"ours": ga, "loader": gb}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true", help="pip install the real loaders into this environment")
    ap.add_argument("--storage", default="local,s3")
    ap.add_argument("--pairs", type=int, default=4, help="an even number: as many pairs with each order")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--shard-mb", type=int, default=200, help="max_shard_size of the publish, MB")
    ap.add_argument("--tensor-parallel", type=int, default=2, help="the replica's ranks (ours reads rank 0's part)")
    ap.add_argument("--link", default="10:40", help="latency_ms:MB_per_s per connection of the emulated link "
                                                     "in front of SeaweedFS ('' for none)")
    ap.add_argument("--ours-only", action="store_true", help="our patterns alone, no real loader (they need torch): "
                    "every path but the comparison, as CI runs it")
    ap.add_argument("--reads", help="MiB:in-flight for our patterns instead of the loaders' defaults")
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--json", help="also save the table here (bench/results/model_load_bench.json for the docs)")
    args = ap.parse_args()
    check_pairs(ap, args.pairs)
    if args.install:
        install()
    table = BenchTable("model_load_bench", "Model loads: our patterns against the real loaders they emulate, one "
                       f"loading rank (tensor-parallel rank 0 of {args.tensor_parallel}), order-balanced ratio of "
                       f"{args.pairs} interleaved pairs",
                       ["storage", "pattern", "real loader", "bytes ours / loader's", "ranged GETs ours / loader's",
                        "ours / loader", "target"])
    figures = {}
    workdir = Path(tempfile.mkdtemp(prefix="model-load-bench-", dir=args.dir))
    try:
        for storage in args.storage.split(","):
            server = None
            if storage == "s3":
                server = seaweedfs(workdir / "server", args.link, BUCKET)
                link = link_of(args.link)
                os.environ.update({"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
                                   "AWS_EC2_METADATA_DISABLED": "true", "RUNAI_STREAMER_S3_ENDPOINT":
                                   server.env()["AWS_ENDPOINT_URL"]})
                root, storage_type, where = f"s3://{BUCKET}", "s3", f"SeaweedFS ({link or 'loopback'})"
            else:
                root, storage_type, where = str(workdir / "local"), "local_fs", "local disk"
            try:
                shards = publish(args, root, storage_type)
                folder = f"{root}/models/publish-1"
                paths = [f"{folder}/{s}" for s in shards]
                # each loader made only where it runs: importing one needs torch
                cases = [("safetensors", "safetensors library (vLLM's calls)",
                          lambda: safetensors_library(args, Path(folder), shards))] if storage == "local" else []
                cases.append(("runai", "runai-model-streamer", lambda: runai_streamer(paths, storage == "local")))
                counts = (lambda: server_gets(server)) if server else None
                for pattern, loader, theirs in cases:
                    if args.ours_only:
                        seconds, n = ours(args, root, storage_type, pattern)()
                        figures[f"{storage}: {pattern}"] = {"ours_bytes": n, "ours_gib_s": n / GiB / seconds}
                        table.add(where, pattern, "none (--ours-only)", f"{n} / -", "-", "-", "0.9-1.1")
                        continue
                    r = pairs(args, f"{where} {pattern}", ours(args, root, storage_type, pattern), theirs(), counts)
                    figures[f"{storage}: {pattern}"] = {**r, "ratio": r["ratio"].describe()}
                    gets = f"{r['gets']['ours']} / {r['gets']['loader']}" if counts else "n/a"
                    table.add(where, pattern, loader, f"{r['ours_bytes']} / {r['loader_bytes']}", gets,
                              r["ratio"].cell(), "0.9-1.1")
            finally:
                if server is not None:
                    server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    table.note("The loader's bytes are the tensors it returned; ours are what our pattern read from storage "
               "(whole pages, or whole shards with their headers; and the index).")
    table.finish(args.json, figures)


def server_gets(server) -> int:
    import re
    import urllib.request
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return sum(int(float(n)) for n in re.findall(
        r'^SeaweedFS_s3_request_total\{bucket="[^"]+",code="206",type="GET"\} ([0-9.e+]+)$', text, re.M))


if __name__ == "__main__":
    main()
