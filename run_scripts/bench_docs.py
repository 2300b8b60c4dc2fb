"""docs/benchmarks.md from bench/results/*.json (each written by a bench's
--json): the method (bench/docs_intro.md), then one table per result file,
with the date, machine and command of the run that produced it.

    python run_scripts/bench_docs.py           # rewrite the page
    python run_scripts/bench_docs.py --check   # exit 1 if the page is stale
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from generated_page import page_main

BENCH = Path(__file__).resolve().parent.parent / "bench"
RESULTS = BENCH / "results"
INTRO = BENCH / "docs_intro.md"
PAGE = BENCH.parent / "docs" / "benchmarks.md"
#: the page's order; a bench without a result file is listed as not recorded yet
BENCHES = {
    "dlio_bench": "the same workload under each DLIO",
    "engine_bench": "engine and POSIX backend against raw I/O",
    "local_bench": "local disk, several ranks, against raw O_DIRECT ranks",
    "buffer_pages": "buffer memory: huge pages against shared maps",
    "local_read_depth": "local O_DIRECT requests in flight",
    "s3_bench": "object storage against raw s3dlio",
    "remote_bench": "remote object storage through the emulated link",
    "cloud_bench": "Azure Blob and GCS against each cloud's own SDK",
    "client_bench": "one preset through each client library (storage_library): GiB/s, requests, CPU, memory",
    "restore_bench": "restores: each load pattern against raw reads of the same ranges",
    "model_load_bench": "model loads: each pattern against the real loader it emulates",
    "layout_bench": "layouts: Megatron-LM's and Orbax's save and load against raw I/O",
    "zstd_ratio": "zstd on checkpoint tensors: what Orbax stores",
    "content_bench": "streaming.content=tensors against incompressible bytes: generation speed and what zstd and lz4 keep",
    "tier_bench": "two tiers: the persistent save's cost to the foreground, at normal and idle priority",
    "training_bench": "DLIO's training loop without checkpoints and with sync, async and tiered saves: AU and step time",
    "trace_bench": "tracing cost",
    "scale_bench": "requests, start-up, end and output size as the ranks grow",
    "discovery_bench": "requests finding the newest whole checkpoint, by layout and ranks",
    "plan_bench": "the plan command's time for each layout at 1,024 and 16,384 ranks",
    "cpu_bench": "client CPU per GiB against raw references",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(result: dict) -> str:
    head = "| " + " | ".join(result["columns"]) + " |\n|" + "---|" * len(result["columns"]) + "\n"
    rows = "".join("| " + " | ".join(_cell(c) for c in row) + " |\n" for row in result["rows"])
    notes = "".join(f"\n{n}\n" for n in result["notes"])
    return (f"### {result['title']}\n\n`{result['command']}`, {result['date']}, {result['machine']}.\n\n"
            f"{head}{rows}{notes}")


def render() -> str:
    results: dict[str, list[dict]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("bench") not in BENCHES:
            raise SystemExit(f"{path}: bench {data.get('bench')!r} is not one of {', '.join(BENCHES)}")
        results.setdefault(data["bench"], []).append(data)
    parts = [INTRO.read_text().rstrip() + "\n"]
    for bench, what in BENCHES.items():
        parts.append(f"\n## `bench/{bench}.py`: {what}\n\n")
        if bench not in results:
            parts.append(f"Not recorded in this form yet: run it with `--json bench/results/{bench}.json` "
                         "(its options: `--help`).\n")
        for result in results.get(bench, []):
            parts.append(table(result))
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    return page_main(__doc__, PAGE, render, argv)

if __name__ == "__main__":
    sys.exit(main())
