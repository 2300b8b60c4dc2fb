"""What a run costs besides its bytes, as the ranks grow: the numbers to extrapolate to 1024 ranks.

    python bench/scale_bench.py [--storage s3|az] [--ranks 1,4,16] [--json bench/results/scale_bench.json]

Runs `dlio_benchmark workload=llama3_tiny_checkpoint` (2 layers, 2 saves + 2
loads, keep_files=False) on a local SeaweedFS (or Azurite, --storage az) at
each rank count, from this environment (run_scripts/setup.sh). Prints per
rank count:
- the requests the server answered by kind (SeaweedFS's own Prometheus
  counters, Azurite's request log, read before and after the run): listings,
  HEADs (SeaweedFS counts them and whole GETs, such as the owner marker's, as
  GET 200), deletes (each a DeleteObjects or a Blob Batch of many keys) and
  the data requests (parts or blocks, upload completions, ranged GETs),
- the non-data requests per rank and the objects each delete request carried,
- DLIO's start-up (launch to the first save) and end (last load to exit),
- the output folder's bytes per rank.
At 16 ranks on 2 cores the times are the CPU's, not the storage's; the counts
and sizes are what scale.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_table import BenchTable  # noqa: E402

from dlio_ckpt_ext.tools import local_cloud, local_s3  # noqa: E402

BUCKET = "scale"
SHRINK = ["++workload.model.num_layers=2", "++workload.model.transformer.hidden_size=256",
          "++workload.model.transformer.ffn_hidden_size=512", "++workload.model.transformer.vocab_size=1024",
          "++workload.model.transformer.num_attention_heads=4", "++workload.model.transformer.num_kv_heads=2"]
#: per storage: the requests that are not data, and which kinds the HEAD and DELETE columns count
NON_DATA = {"s3": ("LIST", "GET 200", "DELETE"), "az": ("LIST", "HEAD", "GET", "BATCH", "DELETE", "CONTAINER", "PUT")}
COLUMNS = {"s3": ("GET 200", "DELETE"), "az": ("HEAD", "BATCH")}


def start_server(storage: str, workdir: Path):
    if storage == "az":
        server = local_cloud.start("az", workdir / "azurite", request_log=True)
        server.create(BUCKET)
    else:
        server = local_s3.start(workdir / "seaweedfs")
        local_s3.create_bucket(server, BUCKET)
    return server


def run(ranks: int, workdir: Path, server, storage: str) -> dict:
    out = workdir / f"out-{ranks}"
    cmd = [shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "-np",
           str(ranks), *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           str(Path(sys.executable).parent / "dlio_benchmark"), "workload=llama3_tiny_checkpoint", *SHRINK,
           "++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=2",
           "++workload.checkpoint.keep_files=False", "++workload.storage.storage_type=s3",
           f"++workload.storage.storage_root={storage}://{BUCKET}", f"++workload.checkpoint.checkpoint_folder=run{ranks}",
           # 16 ranks' upload and read buffers on one small machine (the census does not depend on them)
           "++workload.streaming.chunk_size=8MiB", "++workload.storage.storage_options.max_in_flight=4",
           *(["++workload.storage.storage_options.part_size=8MiB"] if storage == "s3" else []),
           "++workload.streaming.read_parallelism=4",
           f"++workload.output.folder={out}", f"hydra.run.dir={out}"]
    before = server.request_counts()
    launched = time.time()
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **server.env()})
    ended = time.time()
    if res.returncode:
        sys.exit(f"{ranks} ranks failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    time.sleep(0.5)
    after = server.request_counts()
    counts = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    record = json.loads(next(out.rglob("ckpt_ext_summary.json")).read_text())
    windows = [w for phase in ("save", "load") for w in record[phase]["per_checkpoint"]]
    first = min(w["start"] for w in windows)
    last = max(w["end"] for w in windows)
    objects = record["inventory"]["expected"]  # every object of the run's checkpoints
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"ranks": ranks, "counts": counts, "objects": objects, "startup_s": first - launched,
            "end_s": ended - last, "output_bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", choices=("s3", "az"), default="s3")
    ap.add_argument("--ranks", default="1,4,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    server = start_server(args.storage, workdir)
    try:
        results = [run(int(n), workdir, server, args.storage) for n in args.ranks.split(",")]
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    non_data_kinds, (head, delete) = NON_DATA[args.storage], COLUMNS[args.storage]
    server_name = "Azurite" if args.storage == "az" else "SeaweedFS"
    table = BenchTable("scale_bench", f"Requests, start-up, end and output size by ranks ({server_name}, 2 saves + 2 "
                       "loads, keep_files=False)",
                       ["ranks", "objects", "LIST", "HEAD" if args.storage == "az" else "HEAD + whole GET", "DELETE",
                        "objects/DELETE", "non-data/rank",
                        "data requests", "start-up s", "end s", "output KiB/rank"])
    for r in results:
        c = r["counts"]
        non_data = sum(c.get(k, 0) for k in non_data_kinds)
        data = sum(v for k, v in c.items() if k not in non_data_kinds)
        table.add(r["ranks"], r["objects"], c.get("LIST", 0), c.get(head, 0), c.get(delete, 0),
                  f"{r['objects'] / c[delete]:.0f}" if c.get(delete) else "-", f"{non_data / r['ranks']:.1f}",
                  data, f"{r['startup_s']:.1f}", f"{r['end_s']:.1f}", f"{r['output_bytes'] / r['ranks'] / 1024:.0f}")
    # what each figure becomes at 1024 ranks: a straight line through the
    # smallest and largest runs (the census's per-rank part is its slope)
    lo, hi = results[0], results[-1]

    def at(ranks: int, key) -> float:
        a, b = key(lo), key(hi)
        return a + (b - a) * (ranks - lo["ranks"]) / (hi["ranks"] - lo["ranks"]) if hi is not lo else a
    non_data = lambda r: sum(r["counts"].get(k, 0) for k in non_data_kinds)  # noqa: E731
    if hi is not lo:
        table.note(f"At 1024 ranks (a line through {lo['ranks']} and {hi['ranks']} ranks): "
                   f"{at(1024, non_data):.0f} non-data requests a run ({at(1024, non_data) / 1024:.2f} a rank), "
                   f"{at(1024, lambda r: r['counts'].get('LIST', 0)):.0f} listings, "
                   f"{at(1024, lambda r: r['counts'].get(head, 0)):.0f} {head} requests (the owner marker's "
                   "whole GETs on S3), "
                   f"{at(1024, lambda r: r['counts'].get(delete, 0)):.0f} delete requests (one a rank), "
                   f"output {at(1024, lambda r: r['output_bytes']) / 2**20:.0f} MiB "
                   f"({at(1024, lambda r: r['output_bytes']) / 1024 / 1024:.0f} KiB a rank).")
        table.note("The listings are rank 0's alone (its probe, its count of the checkpoints, its inventory of each "
                   "checkpoint at 1,000 objects a request): a 1T run's 10 checkpoints of 2,048 objects each are "
                   "about 25 listings at any rank count; before this census's fixes it was one recursive listing "
                   "per rank plus a HEAD per object per rank (12 / 96 / 1,152 HEADs at 1 / 4 / 16 ranks, ~21 "
                   "million at 1024 ranks and 20,480 objects).")
    table.finish(args.json, {"runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
