"""What a restarting job's search for the newest whole checkpoint costs the storage, by layout and ranks.

    python bench/discovery_bench.py [--ranks 1,4,8] [--layouts dcp,megatron,...] [--saved-at N]
                                    [--json bench/results/discovery_bench.json]

For each layout and rank count, three checkpoints of the test shape are saved
on a local SeaweedFS (the newest then left half-written, as a killed save
leaves it), and `mpirun -np N` ranks look for the newest whole one as the
layout's framework does on restart (Layout.find_latest, docs/recovery.md),
then learn how it was saved from it (Layout.saved_shape: rank 0 reads the
record once and broadcasts it). --saved-at N saves at N ranks whatever the
ranks that look: a job coming back at another size.
Printed: the requests the server answered (its own counters, read before and
after: LIST, HEAD or whole GET as SeaweedFS counts both, "GET 200"), the
requests our client counted, the same per rank, and both extrapolated to
1,024 ranks from the fit requests = a + b x ranks (exact here: every rank
makes the same requests, rank 0 a fixed number more).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

BUCKET = "discovery"
SHAPE = {"num_layers": 2, "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                          "num_attention_heads": 4, "num_kv_heads": 2}}
#: checkpoint.layout (and its settings) of each layout the bench can look in
LAYOUTS = {"deepspeed": ({}, {}), "deepspeed_files": ({"deepspeed_files": "deepspeed"}, {}), "dcp": ({}, {}),
           "megatron": ({}, {"zero_stage": 1}), "orbax": ({}, {}), "safetensors": ({}, {})}
CHECKPOINTS = 3
SCALE = 1024


def config(layout: str, folder: str, ranks: int, bucket: str, **checkpoint):
    from omegaconf import OmegaConf

    from dlio_ckpt_ext.config import load_config
    extra, parallelism = LAYOUTS[layout]
    return load_config(OmegaConf.create({
        "model": {**SHAPE, "parallelism": parallelism},
        "streaming": {"chunk_size": "8MiB", "read_size": "8MiB"},
        "storage": {"storage_type": "s3", "storage_root": f"s3://{bucket}"},
        "checkpoint": {"checkpoint_folder": folder, "layout": layout.split("_")[0], **extra, **checkpoint}}), ranks)


def save(layout: str, folder: str, ranks: int, bucket: str) -> str:
    """CHECKPOINTS checkpoints of every rank, in one process (rank 0 last: its commit
    follows every rank's files), the newest then left as a killed save leaves it
    (no commit, or a data file missing; the tracker naming the one before).
    Returns the half-written folder's name."""
    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    cfg = config(layout, folder, ranks, bucket, num_checkpoints_write=CHECKPOINTS, num_checkpoints_read=0)
    for rank in reversed(range(ranks)):
        ck = Checkpointer(cfg, rank, ranks, ranks)
        ck.prepare()
        for step in range(1, CHECKPOINTS + 1):
            ck.save(step)
        ck.close()
    ck = Checkpointer(cfg, 0, ranks, ranks)
    plan, name = ck.rank_plan(0), ck.directory(CHECKPOINTS)
    doomed = [f.name for f in plan.commit_files if "/" not in f.name or layout != "orbax"] or [plan.files[-1].name]
    if layout == "orbax":
        doomed = ["commit_success.txt"]
    ck.backend.delete_files([f"{name}/{f}" for f in doomed])
    for root, content in ck.layout.root_files(CHECKPOINTS - 1):
        ck.backend.write_marker(root, content)
    return name


def look(layout: str, folder: str, bucket: str) -> None:
    """Under mpirun: every rank looks, rank 0 prints what was found and every rank's requests."""
    from mpi4py import MPI

    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    from dlio_ckpt_ext.recovery import discovery
    comm = MPI.COMM_WORLD
    cfg = config(layout, folder, comm.size, bucket, num_checkpoints_write=0, num_checkpoints_read=1, resume="latest")
    ck = Checkpointer(cfg, comm.rank, comm.size, comm.size)
    lk = discovery.Look(ck.backend, comm.rank, lambda v: comm.allreduce(v, op=MPI.MAX), lambda v: comm.bcast(v, root=0))
    latest = ck.layout.find_latest(lk, ck.checkpoint_files)
    shape = discovery.saved_shape(ck.layout, lk, latest)
    counted = comm.gather(lk.requests, root=0)
    if comm.rank == 0:
        print(json.dumps({"found": latest.name, "skipped": latest.skipped, "requests": counted,
                          "saved_world": shape.world if shape else None}), flush=True)


def measure(server, layout: str, ranks: int, mpirun: str, bucket: str = BUCKET, saved_at: int = 0) -> dict:
    """saved_at: the ranks the checkpoints are saved at (0: the ranks that look)."""
    folder = f"{layout}-{ranks}-{saved_at}"
    env = {**os.environ, **server.env()}
    # in a process of its own: s3dlio keeps the first endpoint a process used
    saving = subprocess.run([sys.executable, __file__, "--save", layout, folder, str(saved_at or ranks), bucket],
                            capture_output=True, text=True, env=env, timeout=300)
    if saving.returncode:
        sys.exit(f"saving {layout} at {ranks} ranks failed:\n{saving.stderr[-2000:]}")
    half = saving.stdout.strip().splitlines()[-1]
    time.sleep(0.5)  # the server's counters of the saves settle first
    before = server.request_counts()
    res = subprocess.run([mpirun, "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np",
                          str(ranks), sys.executable, __file__, "--look", layout, folder, bucket],
                         capture_output=True, text=True, env=env, timeout=300)
    if res.returncode:
        sys.exit(f"{layout} at {ranks} ranks failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    time.sleep(0.5)
    after = server.request_counts()
    got = json.loads(res.stdout.strip().splitlines()[-1])
    ours: dict[str, int] = {}
    for rank in got["requests"]:
        for kind, n in rank.items():
            ours[kind] = ours.get(kind, 0) + n
    server_counts = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    return {"layout": layout, "ranks": ranks, "found": got["found"], "skipped": got["skipped"], "half": half,
            "server": server_counts, "ours": ours, "saved_world": got["saved_world"]}


def extrapolate(points: list[tuple[int, int]], at: int = SCALE) -> int:
    """a + b x ranks through the first and last point."""
    (r0, n0), (r1, n1) = points[0], points[-1]
    slope = (n1 - n0) / (r1 - r0) if r1 != r0 else n0 / r0
    return round(n0 + slope * (at - r0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,4,8")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--saved-at", type=int, default=0, help="save at this many ranks (default: the ranks that look)")
    ap.add_argument("--json")
    ap.add_argument("--look", nargs=3, metavar=("LAYOUT", "FOLDER", "BUCKET"), help=argparse.SUPPRESS)
    ap.add_argument("--save", nargs=4, metavar=("LAYOUT", "FOLDER", "RANKS", "BUCKET"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.save:
        layout, folder, ranks, bucket = args.save
        print(save(layout, folder, int(ranks), bucket))
        return 0
    if args.look:
        look(*args.look)
        return 0
    from bench_servers import seaweedfs
    from bench_table import BenchTable
    mpirun = str(Path(sys.executable).parent / "mpirun")
    ranks = [int(n) for n in args.ranks.split(",")]
    server = seaweedfs(Path(tempfile.mkdtemp(prefix="discovery-bench-")), "", BUCKET)
    try:
        results = [measure(server, layout, n, mpirun, saved_at=args.saved_at)
                   for layout in args.layouts.split(",") for n in ranks]
    finally:
        server.stop()
    saved = f"saved at {args.saved_at} ranks" if args.saved_at else "saved at the ranks that look"
    table = BenchTable("discovery_bench", f"Requests finding the newest whole checkpoint (3 {saved}, the newest "
                       "half-written) and learning how it was saved, by layout and ranks: SeaweedFS's own "
                       "counters, ours beside them",
                       ["layout", "ranks", "found", "saved by", "server", "server total", "ours", "per rank",
                        f"at {SCALE} ranks"])
    for layout in args.layouts.split(","):
        rows = [r for r in results if r["layout"] == layout]
        points = [(r["ranks"], sum(r["ours"].values())) for r in rows]
        for r in rows:
            total = sum(r["ours"].values())
            table.add(layout, r["ranks"], r["found"], r["saved_world"] or "-", ", ".join(f"{k} {n}" for k, n in sorted(r["server"].items())),
                      sum(r["server"].values()), ", ".join(f"{k} {n}" for k, n in sorted(r["ours"].items())), f"{total / r['ranks']:.1f}",
                      extrapolate(points) if r is rows[-1] else "")
    table.note("SeaweedFS counts a HEAD as a GET (200 found, 404 missing); every row found the checkpoint before "
               "the half-written one and named that one.")
    table.finish(args.json, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
