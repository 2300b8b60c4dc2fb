"""dlio-ckpt-submit: an MLPerf Storage checkpointing submission run.

Checks the CLOSED rules for the preset, host list and ranks per host, runs
the write phase, drops every host's page cache when it can (root), starts
the read phase within 30 s, and writes submission.json next to both
phases' results:

  dlio-ckpt-submit --workload llama3_8b_checkpoint --hosts node1,node2 --ranks-per-host 4
  dlio-ckpt-submit --workload llama3_tiny_checkpoint --ranks-per-host 2 --open -- \\
      ++workload.checkpoint.num_checkpoints_write=2 ++workload.checkpoint.num_checkpoints_read=2
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from dlio_ckpt_ext import plan
from dlio_ckpt_ext.config import RunConfig, load_config
from dlio_ckpt_ext.dlio.records import RECORD_FILE
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.executables import find_executable
from dlio_ckpt_ext.redact import redact_args, redact_text
from dlio_ckpt_ext.report.results import flatten

CLOSED_PROCESSES = {"llama3_8b": 8, "llama3_70b": 64, "llama3_405b": 512, "llama3_1t": 1024}
CLOSED_CHECKPOINTS = 10
MIN_RANKS_PER_HOST = 4
READ_START_LIMIT_S = 30.0


@dataclass
class Submission:
    workload: str
    hosts: list[str]
    ranks_per_host: int
    overrides: list[str] = field(default_factory=list)
    subset_data: Optional[int] = None  # subset mode: data-parallel degree of the full job

    @property
    def ranks(self) -> int:
        return len(self.hosts) * self.ranks_per_host

    @property
    def mode_overrides(self) -> list[str]:
        """What --subset-data sets: part of a CLOSED run, unlike user overrides."""
        if not self.subset_data:
            return []
        return ["++workload.checkpoint.mode=subset", f"++workload.model.parallelism.data={self.subset_data}"]

    @property
    def all_overrides(self) -> list[str]:
        return [*self.overrides, *self.mode_overrides]


def presets() -> list[str]:
    from hydra_plugins.dlio_ckpt_ext_searchpath import presets_location
    location = presets_location()
    if location.startswith("file://"):
        folder = Path(location[len("file://"):]) / "workload"
    else:
        import importlib.resources
        folder = Path(str(importlib.resources.files("dlio_ckpt_ext.configs") / "workload"))
    return sorted(p.stem for p in folder.glob("*_checkpoint.yaml"))


def effective_config(sub: Submission, with_user_overrides: bool = True) -> RunConfig:
    """The preset with the overrides, composed by hydra exactly as dlio_benchmark would
    (without the user's overrides: the preset as CLOSED requires it)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import MissingConfigException
    overrides = sub.all_overrides if with_user_overrides else sub.mode_overrides
    try:
        with initialize_config_module(config_module="dlio_benchmark.configs", version_base=None):
            cfg = compose(config_name="config", overrides=[f"workload={sub.workload}", *overrides])
    except MissingConfigException:
        raise ConfigError("--workload", sub.workload, "one of the checkpoint presets: " + ", ".join(presets()))
    return load_config(cfg.workload, sub.ranks)


def written(cfg: RunConfig) -> dict:
    """Every setting that decides what a run writes: model shape and dtypes,
    parallelism and checkpoint mode, content properties."""
    sections = asdict(cfg.sections)
    return {**{f"model.{k}": v for k, v in flatten(sections["model"]).items() if k not in ("name",)},
            "checkpoint.mode": cfg.checkpoint.mode,
            "checkpoint.layout": cfg.checkpoint.layout,
            "streaming.dedup_ratio": cfg.streaming.dedup_ratio,
            "streaming.compress_ratio": cfg.streaming.compress_ratio}


def same_as_preset(sub: Submission, cfg: RunConfig) -> list[str]:
    """CLOSED: the bytes each rank writes, and their content properties, are
    exactly the unmodified preset's for this process count."""
    preset = effective_config(sub, with_user_overrides=False)
    mine, theirs = written(cfg), written(preset)
    out = [f"{k} is {mine.get(k)!r}; CLOSED requires the preset's {theirs.get(k)!r}"
           for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    for rank in range(sub.ranks):
        got = plan.rank_plan(cfg.shape, cfg.parallelism, sub.ranks, rank).files
        want = plan.rank_plan(preset.shape, preset.parallelism, sub.ranks, rank).files
        if got != want:
            out.append(f"rank {rank} writes {sum(f.size for f in got)} bytes in {len(got)} files; CLOSED requires "
                       f"the preset's {sum(f.size for f in want)} bytes in {len(want)} files")
            break
    return out


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_closed_rules(sub: Submission, cfg: RunConfig, can_drop_cache: bool, ram_bytes: int) -> list[str]:
    """Every way this run would not be a valid CLOSED submission."""
    out = same_as_preset(sub, cfg)
    c, par = cfg.checkpoint, cfg.parallelism
    required = CLOSED_PROCESSES.get(cfg.model.name)
    if required is None:
        out.append(f"model {cfg.model.name!r} is not a CLOSED model ({', '.join(CLOSED_PROCESSES)})")
    else:
        job = par.data * par.tensor * par.pipeline if par.mode == "subset" else sub.ranks
        what = "data*tensor*pipeline of the subset run" if par.mode == "subset" else "processes"
        if job != required:
            out.append(f"{what} is {job}; CLOSED {cfg.model.name} requires {required}")
    for key in ("num_checkpoints_write", "num_checkpoints_read"):
        if getattr(c, key) != CLOSED_CHECKPOINTS:
            out.append(f"checkpoint.{key} is {getattr(c, key)}; CLOSED requires {CLOSED_CHECKPOINTS}")
    if not c.fsync:
        out.append("checkpoint.fsync is off; CLOSED requires it on")
    if sub.ranks_per_host < MIN_RANKS_PER_HOST:
        out.append(f"{sub.ranks_per_host} ranks per host; CLOSED requires at least {MIN_RANKS_PER_HOST}")
    if not can_drop_cache:
        for i, host in enumerate(sub.hosts):
            ranks = range(i * sub.ranks_per_host, (i + 1) * sub.ranks_per_host)
            written = c.num_checkpoints_write * sum(
                plan.rank_plan(cfg.shape, par, sub.ranks, r).total_bytes for r in ranks)
            if written >= 3 * ram_bytes:
                continue
            out.append(f"host {host} writes {written / 2**30:.1f} GiB, less than 3x its RAM "
                       f"({3 * ram_bytes / 2**30:.1f} GiB) and the page cache cannot be dropped (not root)")
    return out


def mpirun(sub: Submission, np_per_host: int, command: list[str], extra: list[str]) -> list[str]:
    hosts = ",".join(f"{h}:{np_per_host}" for h in sub.hosts)
    args = [find_executable("mpirun"), "--host", hosts, "-np", str(len(sub.hosts) * np_per_host)]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    if sub.hosts == ["localhost"] and np_per_host > (os.cpu_count() or 1):
        args.append("--oversubscribe")
    return args + extra + command


def run_phase(sub: Submission, name: str, results: Path, phase_overrides: list[str], extra: list[str]) -> dict:
    out = results / name
    dlio = [find_executable("dlio_benchmark"), f"workload={sub.workload}", *sub.all_overrides, *phase_overrides,
            f"++workload.output.folder={out}"]
    cmd = mpirun(sub, sub.ranks_per_host, dlio, extra)
    print(f"[submit] {name} phase: {' '.join(redact_args(cmd))}", flush=True)
    if subprocess.call(cmd) != 0:
        raise SystemExit(f"[submit] the {name} phase failed; see its output above")
    return json.loads((out / RECORD_FILE).read_text())


def drop_caches(sub: Submission, extra: list[str]) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root: page cache not dropped; reads use O_DIRECT or posix_fadvise(DONTNEED)"
    cmd = mpirun(sub, 1, [sys.executable, "-m", "dlio_ckpt_ext.dropcache"], extra)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return False, f"page cache not dropped ({res.stderr.strip().splitlines()[-1:]}); reads rely on O_DIRECT"
    return True, "page cache dropped on every host (sync; echo 3 > /proc/sys/vm/drop_caches)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dlio-ckpt-submit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, help="a checkpoint preset, e.g. llama3_8b_checkpoint")
    ap.add_argument("--hosts", default="localhost", help="comma-separated host names (default localhost)")
    ap.add_argument("--ranks-per-host", type=int, required=True)
    ap.add_argument("--subset-data", type=int, help="subset mode: data-parallel degree of the full job")
    ap.add_argument("--results-dir", help="default results/<workload>-<UTC time>")
    ap.add_argument("--open", action="store_true", help="run even if CLOSED rules are broken (reported)")
    ap.add_argument("--host-ram-gib", type=float, help="RAM per host (default: this host's)")
    ap.add_argument("--mpirun-arg", action="append", default=[], help="extra mpirun argument (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="check the rules and stop")
    ap.add_argument("overrides", nargs="*", help="after --: hydra overrides for both phases")
    args = ap.parse_args(argv)
    sub = Submission(args.workload, args.hosts.split(","), args.ranks_per_host, list(args.overrides),
                     args.subset_data)
    overrides = sub.all_overrides
    try:
        cfg = effective_config(sub)
        find_executable("mpirun")
    except (ConfigError, FileNotFoundError) as exc:
        print(redact_text(f"[submit] {exc}"), file=sys.stderr)
        return 2
    ram = int(args.host_ram_gib * 2**30) if args.host_ram_gib else host_ram_bytes()
    violations = check_closed_rules(sub, cfg, os.geteuid() == 0, ram)
    for v in violations:
        print(f"[submit] CLOSED rule: {v}", flush=True)
    if violations and not args.open:
        print("[submit] not a valid CLOSED run; fix the above or pass --open to run it as OPEN", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results = Path(args.results_dir or f"results/{args.workload}-{stamp}").resolve()
    results.mkdir(parents=True, exist_ok=True)
    c = cfg.checkpoint
    write = run_phase(sub, "write", results, ["++workload.checkpoint.num_checkpoints_read=0"], args.mpirun_arg)
    dropped, cache_note = drop_caches(sub, args.mpirun_arg)
    print(f"[submit] {cache_note}", flush=True)
    read = run_phase(sub, "read", results, ["++workload.checkpoint.num_checkpoints_write=0",
                                            f"++workload.checkpoint.num_checkpoints_read={c.num_checkpoints_read}"],
                     args.mpirun_arg)
    gap = read["start_time"] - write["end_time"]
    if gap > READ_START_LIMIT_S:
        violations.append(f"the read phase started {gap:.1f} s after the write phase ended "
                          f"(limit {READ_START_LIMIT_S:.0f} s)")
    report = {"workload": args.workload, "hosts": sub.hosts, "ranks_per_host": sub.ranks_per_host,
              "ranks": sub.ranks, "overrides": redact_args(overrides),
              "division": "OPEN" if violations else "CLOSED",
              "closed_rule_violations": violations, "page_cache_dropped": dropped, "cache_note": cache_note,
              "read_start_after_write_s": gap,
              "save": {k: write["save"][k] for k in ("throughput_gib_s_mean", "throughput_gib_s_std",
                                                     "duration_s_mean", "duration_s_std")},
              "load": {k: read["load"][k] for k in ("throughput_gib_s_mean", "throughput_gib_s_std",
                                                    "duration_s_mean", "duration_s_std")},
              "phases": {"write": str(results / "write"), "read": str(results / "read")},
              "finished_at": time.time()}
    (results / "submission.json").write_text(json.dumps(report, indent=1))
    print(f"[submit] {report['division']}: save {report['save']['throughput_gib_s_mean']:.4f} GiB/s, "
          f"load {report['load']['throughput_gib_s_mean']:.4f} GiB/s, read phase started {gap:.1f} s after "
          f"the write phase; {results / 'submission.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
