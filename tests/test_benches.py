"""Every bench under bench/ runs, at its smallest size: a bench nobody can rerun is a claim
nobody can check (issue 62 item 8: the layout bench had crashed since a layout change, unseen).
Each is run as a user runs it, `python bench/NAME.py ...`, with its --json where it has one: the
table's rows and figures must be there. The figures themselves are the benches' own subject
(docs/benchmarks.md), not these tests': at these sizes they measure start-up more than storage.
The real loaders model_load_bench compares with need torch, which no test environment has: it runs
our patterns alone here (--ours-only)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.e2e  # several start DLIO (conftest.py)

#: each bench's smallest run ({tmp}: the test's scratch folder); the JSON's figures' keys to find
BENCHES = {
    "buffer_pages": ("--dir {tmp}/bp --size 32MiB --rounds 1 --settle 0", ["medians_gib_s"]),
    "client_bench": ("--preset llama3_tiny_checkpoint --ranks 1 --layers 1 --hidden 64 --rounds 1",
                     ["s3dlio", "s3torchconnector", "minio", "msc", "tensorstore"]),
    "cloud_bench": ("--kinds az,gs --size 16MiB --chunk 4MiB --max-in-flight 4 --reps 1", ["az", "gs"]),
    "content_bench": ("--mib 32 --rounds 1", []),
    "cpu_bench": ("--checkpoints 1 --layers 1 --hidden 64 --paths local,S3 --generation-gib 0.25 --dir {tmp}",
                  ["local", "S3", "generation_only"]),
    "discovery_bench": ("--ranks 1,2 --layouts deepspeed", ["results"]),
    "dlio_bench": ("--dlios this,this --ranks 1 --pairs 2 --writes 1 --reads 1 --hidden 64 --vocab 1024 "
                   "--settle 0 --dir {tmp}", []),
    "engine_bench": ("--dir {tmp}/eng --size 32MiB --chunk 8MiB --depth 2 --threads 2 --reps 1 --rss-size 64MiB",
                     ["medians_gib_s"]),
    "layout_bench": ("--layouts megatron,orbax --pairs 2 --layers 2 --hidden 64 --vocab 1024 --dir {tmp}",
                     ["megatron save", "megatron load", "orbax save", "orbax load"]),
    "local_bench": ("--dir {tmp} --ranks 1 --pairs 2 --writes 1 --reads 1 --hidden 64 --vocab 1024 --settle 0", []),
    "local_read_depth": ("{tmp} --rounds 1 --mib 64", []),
    "local_read_depth --writes": ("{tmp} --rounds 1 --mib 64 --writes", []),
    "model_load_bench": ("--ours-only --storage local,s3 --layers 1 --hidden 256 --shard-mb 16 --tensor-parallel 1 "
                         "--link '' --dir {tmp}", ["local: safetensors", "local: runai", "s3: runai"]),
    "plan_bench": ("--ranks 32", []),
    "remote_bench": ("--links 0:0 --ranks 1 --pairs 2 --writes 1 --reads 1 --layers 1 --hidden 64 --vocab 1000 "
                     "--sweep 4 --dir {tmp}", []),
    "restore_bench": ("--storage local,remote --link '' --pairs 2 --layers 2 --hidden 64 --vocab 1024 --dir {tmp}",
                      []),
    "s3_bench": ("--size 32MiB --part-size 8MiB --max-in-flight 4 --reps 1 --rss-size 64MiB", ["ratios", "rss"]),
    "scale_bench": ("--storage s3 --ranks 1,2", ["runs"]),
    "tier_bench": ("--dir {tmp} --ranks 2 --pairs 2 --gib-per-rank 0.05 --writes 4 --settle 0", ["normal", "idle"]),
    "trace_bench": ("--ranks 1 --pairs 1 --writes 1 --hidden 64 --dir {tmp}", []),
    "training_bench": ("--dir {tmp} --ranks 2 --rounds 1 --modes tiers --hidden 64 --vocab 1024 --steps 4 --every 2 "
                       "--compute 0.01 --settle 0", ["none", "tiers"]),
    "zstd_ratio": ("--mib 16", []),
}
#: the benches with no --json: what their output must say
WITHOUT_JSON = {"retry_log_bench": ("--requests 1000", "lines read and counted"),
                "trace_bench --per-event": ("--per-event --events 1000", "")}


def run_bench(name: str, args: str, tmp_path) -> subprocess.CompletedProcess:
    script = REPO / "bench" / f"{name.split()[0]}.py"
    # TMPDIR: a bench's own temporary folders go with the test's
    env = {**os.environ, "TMPDIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = f"{sys.executable} {script} {args.format(tmp=tmp_path)}"
    return subprocess.run(cmd, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_every_bench_is_run_here():
    """A new bench is added here, or the test says which."""
    helpers = {"bench_servers", "bench_table", "pairs", "raw_posix_rank", "raw_rank_common", "raw_s3_rank"}
    scripts = {p.stem for p in (REPO / "bench").glob("*.py")} - helpers
    assert scripts == {n.split()[0] for n in (*BENCHES, *WITHOUT_JSON)}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_the_bench_runs_at_its_smallest_size_and_saves_its_table(name, tmp_path):
    args, figure_keys = BENCHES[name]
    out = tmp_path / f"{name.split()[0]}.json"
    res = run_bench(name, f"{args} --json {out}", tmp_path)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    table = json.loads(out.read_text())
    assert table["bench"] == name.split()[0] and table["rows"] and all(len(r) == len(table["columns"]) for r in table["rows"])
    assert set(figure_keys) <= set(table["figures"]), sorted(table["figures"])


@pytest.mark.parametrize("name", sorted(WITHOUT_JSON))
def test_the_bench_without_a_table_runs_at_its_smallest_size(name, tmp_path):
    args, said = WITHOUT_JSON[name]
    res = run_bench(name, args, tmp_path)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert said in res.stdout + res.stderr
