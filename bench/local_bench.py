"""Local disk: our defaults against raw O_DIRECT at the same process count, in one run.

    python bench/local_bench.py --dir /work/bench_data [--ranks 1,2,4] [--pairs 4] [--gib-per-rank 1] [--settle 10]

For each rank count, our defaults (`dlio_benchmark workload=llama3_tiny_checkpoint`
scaled so each rank writes about --gib-per-rank, local_fs, nothing else tuned)
and the raw reference (bench/raw_posix_rank.py under mpirun: pre-filled
aligned buffers, O_DIRECT writes of 32 MiB + fsync, O_DIRECT reads) run in
interleaved pairs (A B / B A, a warm-up pair first, as many pairs of each
order), on the same directory.
Both are timed the same way: per checkpoint a barrier, then the window from
the first rank's start to the last rank's end. Before every run the page
cache is synced and the disk left idle for --settle seconds: on this VM a
run started right after another is slower (back-to-back rounds of three
writers: the third position always slowest, ~20 %). The pause does not
remove the order effect between the two programs (bench/pairs.py). Prints
per pair both runs' rates, then the ours/raw ratio for save and load with the
order effect cancelled (bench/pairs.py), our generation margin (fill rate /
I/O rate, and the generation-bound chunks) and the peak RSS per rank of each.
"""
from __future__ import annotations

import argparse
import os
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402
from pairs import OrderedRatios, check_pairs  # noqa: E402
from remote_bench import BIN, GiB, HERE, mpirun, raw_result  # noqa: E402


#: the scaled model's vocabulary unless --vocab says otherwise
VOCAB = 32000


def shape(gib_per_rank: float, ranks: int, vocab: int = VOCAB, hidden: int = 0) -> dict:
    """A llama3-shaped model (ZeRO-3) whose shard is about gib_per_rank per rank: the
    smallest hidden size from 512 up in steps of 256, or `hidden` where given."""
    from dlio_ckpt_ext import layouts
    from dlio_ckpt_ext.shared_plans import plan
    fixed, hidden = hidden > 0, hidden or 512
    while True:
        m = plan.ModelShape(2, hidden, hidden * 7 // 2, vocab, 8, 2, "fp16", "fp32")
        per_rank = layouts.checkpoint_bytes(m, plan.Parallelism(1, 1, 3), ranks) / ranks
        if fixed or per_rank >= gib_per_rank * GiB:
            return {"hidden": hidden, "sizes": [f.size for f in layouts.rank_plan(m, plan.Parallelism(1, 1, 3), ranks,
                                                                                   0).files]}
        hidden += 256


# Both write into the same folder: the file system has the same free space
# to place either's files.
SHARED_DIR = "ckpt"


def settle(seconds: float) -> None:
    """A pause before every run (see the docstring)."""
    os.sync()
    time.sleep(seconds)


def dlio_command(args, hidden: int, out: Path, bin_dir: Path = BIN) -> list[str]:
    """Our defaults on the tiny preset scaled to `hidden`, into args.dir, results to `out`."""
    return [str(bin_dir / "dlio_benchmark"), "workload=llama3_tiny_checkpoint",
            f"++workload.checkpoint.checkpoint_folder={Path(args.dir) / SHARED_DIR}",
            f"++workload.output.folder={out}",
            f"++workload.checkpoint.num_checkpoints_write={args.writes}",
            f"++workload.checkpoint.num_checkpoints_read={args.reads}",
            "++workload.checkpoint.keep_files=False", *model_overrides(hidden, args.vocab)]


def model_overrides(hidden: int, vocab: int) -> list[str]:
    """The tiny preset scaled to shape()'s model."""
    return ["++workload.model.num_layers=2", f"++workload.model.transformer.hidden_size={hidden}",
            f"++workload.model.transformer.ffn_hidden_size={hidden * 7 // 2}",
            f"++workload.model.transformer.vocab_size={vocab}"]


def scaled_model_options(ap: argparse.ArgumentParser) -> None:
    """The scaled model's size beyond --gib-per-rank (the smallest run: --hidden 64 --vocab 1024)."""
    ap.add_argument("--hidden", type=int, default=0, help="the model's hidden size (default: from --gib-per-rank)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="the model's vocabulary")


def run_ours(args, ranks: int, hidden: int, tag: str, workdir: Path) -> dict:
    out = workdir / tag
    cmd = mpirun(ranks) + dlio_command(args, hidden, out)
    res = subprocess.run(cmd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=workdir,
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"our run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    record = json.loads((out / "ckpt_ext_summary.json").read_text())
    stats = [json.loads(p.read_text()) for p in (out / "rank_stats").glob("*.json")]
    save = record["save"]["results"]
    return {"save": record["save"]["throughput_gib_s_mean"], "load": record["load"]["throughput_gib_s_mean"],
            "rss": max(s["peak_rss_bytes"] for s in stats), "margin": save["generation_to_io_ratio"],
            "gen_bound": save["chunks_fill_bound"], "threads": stats[0]["gen_threads"]}


def run_raw(args, ranks: int, sizes: list[int]) -> dict:
    cmd = mpirun(ranks) + [sys.executable, str(HERE / "raw_posix_rank.py"), "--dir", str(Path(args.dir) / SHARED_DIR),
                           "--sizes", ",".join(map(str, sizes)), "--writes", str(args.writes),
                           "--reads", str(args.reads)]
    return raw_result(cmd, None, sizes, ranks)


def disk_options(ap: argparse.ArgumentParser, settle: float, checkpoints: int) -> None:
    """The options of a bench of paired runs on a local disk."""
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure")
    ap.add_argument("--pairs", type=int, default=4, help="an even number: as many pairs with each order")
    ap.add_argument("--settle", type=float, default=settle, help="seconds of idle disk before every run")
    ap.add_argument("--writes", type=int, default=checkpoints)
    ap.add_argument("--reads", type=int, default=checkpoints)
    ap.add_argument("--gib-per-rank", type=float, default=1.0)
    scaled_model_options(ap)
    ap.add_argument("--json", help="also save the table here (bench/results/NAME.json for the docs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2,4")
    disk_options(ap, settle=10.0, checkpoints=2)
    args = ap.parse_args()
    check_pairs(ap, args.pairs)
    workdir = Path(tempfile.mkdtemp(prefix="local-bench-"))
    table = BenchTable("local_bench", f"Local disk, several ranks: our defaults against a raw O_DIRECT writer/reader "
                       f"per rank under mpirun (~{args.gib_per_rank:g} GiB per rank per checkpoint, {args.writes} "
                       f"writes and {args.reads} reads per run; order-balanced ratio of {args.pairs} interleaved pairs)",
                       ["ranks", "save ours / raw", "load ours / raw", "raw save / load GiB/s",
                        "generation margin (min)", "generation-bound chunks", "peak RSS per rank ours (raw)"])
    for ranks in (int(r) for r in args.ranks.split(",")):
        model = shape(args.gib_per_rank, ranks, args.vocab, args.hidden)
        ratios = {"save": OrderedRatios(), "load": OrderedRatios()}
        ours_all, raw_all = [], []
        for i in range(args.pairs + 1):
            order = ("ours", "raw") if i % 2 == 0 else ("raw", "ours")
            got = {}
            for who in order:
                settle(args.settle)
                got[who] = (run_ours(args, ranks, model["hidden"], f"r{ranks}-{i}", workdir) if who == "ours"
                            else run_raw(args, ranks, model["sizes"]))
            print(f"  {ranks} rank(s) pair {i}{' (warm-up)' if i == 0 else ''}, {order[0]} first: GiB/s save ours "
                  f"{got['ours']['save']:.2f} raw {got['raw']['save']:.2f}, load ours {got['ours']['load']:.2f} "
                  f"raw {got['raw']['load']:.2f}", flush=True)
            if i == 0:
                continue
            for phase in ratios:
                ratios[phase].add(order[0] == "ours", got["ours"][phase] / got["raw"][phase])
            ours_all.append(got["ours"])
            raw_all.append(got["raw"])
        print(f"{ranks} rank(s), per-rank files {[s >> 20 for s in model['sizes']]} MiB: ours / raw O_DIRECT "
              f"save {ratios['save'].describe()}, load {ratios['load'].describe()}; "
              f"raw save {statistics.median(r['save'] for r in raw_all):.2f} GiB/s, load "
              f"{statistics.median(r['load'] for r in raw_all):.2f} GiB/s; our generation margin "
              f"{min(o['margin'] for o in ours_all):.2f}x at {ours_all[0]['threads']} thread(s), generation-bound "
              f"chunks {max(o['gen_bound'] for o in ours_all)}; peak RSS per rank ours "
              f"{max(o['rss'] for o in ours_all) / 2**20:.0f} MiB, raw {max(r['rss'] for r in raw_all) / 2**20:.0f} MiB",
              flush=True)
        table.add(ranks, ratios["save"].cell(), ratios["load"].cell(),
                  f"{statistics.median(r['save'] for r in raw_all):.2f} / {statistics.median(r['load'] for r in raw_all):.2f}",
                  f"{min(o['margin'] for o in ours_all):.2f}x ({ours_all[0]['threads']} thread(s))",
                  max(o["gen_bound"] for o in ours_all),
                  f"{max(o['rss'] for o in ours_all) / 2**20:.0f} MiB ({max(r['rss'] for r in raw_all) / 2**20:.0f})")
    table.note("Both sides timed first rank start to last rank end, writing into the same folder, `sync` and idle "
               "before every run; the raw ranks write unique bytes generated before each checkpoint from memory "
               "mapped as ours (`buffers.allocate`) and read with 16 x 8 MiB `preadv` in flight per rank, as ours.")
    table.finish(args.json)


if __name__ == "__main__":
    main()
