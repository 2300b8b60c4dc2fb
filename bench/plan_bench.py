"""How long `dlio-ckpt-report plan` takes for each layout's preset at 1,024 and
16,384 ranks, its own restore and the framework's (nothing runs, nothing is
read: the plan's arithmetic alone, one process). A plan is O(ranks x what a
rank reads); this says what that costs at the scales users plan for.

    python bench/plan_bench.py [--ranks 1024 16384] [--json bench/results/plan_bench.json]"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402

from dlio_ckpt_ext.report.load_plans import plan_command  # noqa: E402

#: a preset a layout, with what it needs at 16,384 ranks (MaxText's 8B: one device a rank and
#: 4 replicas, so the FSDP degree divides its hidden size)
PRESETS = [("deepspeed", "llama3_8b_checkpoint", []),
           ("dcp", "torchtitan_llama3_8b_checkpoint", []),
           ("megatron", "megatron_llama3_8b_checkpoint", []),
           ("orbax", "maxtext_llama3_8b_checkpoint", ["++workload.checkpoint.devices_per_rank=1",
                                                      "++workload.checkpoint.replicas=4"]),
           ("safetensors", "llama3_8b_model_load", []),
           # 70B at the presets' own devices a rank (MaxText's 8, with 16 replicas: FSDP 8,192)
           ("deepspeed", "llama3_70b_checkpoint", []),
           ("megatron", "megatron_llama3_70b_checkpoint", []),
           ("orbax", "maxtext_llama3_70b_checkpoint", ["++workload.checkpoint.replicas=16"]),
           ("safetensors", "llama3_70b_model_load", [])]


def timed(workload: str, ranks: int, overrides: list[str]) -> float:
    start = time.perf_counter()
    plan_command(workload, ranks, overrides)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--json", help="also save the table (bench/results/plan_bench.json for the docs)")
    args = ap.parse_args()
    table = BenchTable("plan_bench", "dlio-ckpt-report plan: seconds for each layout's preset, one process",
                       ["layout", "preset", "restore", *[f"{n:,} ranks" for n in args.ranks]])
    figures = {}
    for layout, workload, extra in PRESETS:
        loads = [("own", [])] if layout == "safetensors" else [
            ("own", []), ("framework", ["++workload.checkpoint.restore=framework"])]
        for restore, more in loads:
            seconds = [timed(workload, n, extra + more) for n in args.ranks]
            figures[f"{workload} {restore}"] = dict(zip(map(str, args.ranks), seconds))
            table.add(layout, workload, restore if layout != "safetensors" else "safetensors (vLLM)",
                      *[f"{s:.1f} s" for s in seconds])
    table.finish(args.json, figures)


if __name__ == "__main__":
    main()
