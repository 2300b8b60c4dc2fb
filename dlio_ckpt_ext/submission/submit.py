"""dlio-ckpt-submit: an MLPerf Storage checkpointing submission run.

Checks the CLOSED rules for the preset, host list and ranks per host, runs
the write invocation, drops every host's page cache when it can (root),
starts the read invocation, and writes the submission tree MLCommons'
checker reads (tree.py), with results.json (the submission's
summary, the gap between the invocations included) in the model folder:

  dlio-ckpt-submit --model llama3-8b --hosts node1,node2 --num-processes 8 --org ORG --system SYS \\
      --results-dir RESULTS --checkpoint-folder /mnt/ckpt
  dlio-ckpt-submit --workload llama3_8b_checkpoint --ranks-per-host 2 --open -- ++workload.model.num_layers=2
  dlio-ckpt-submit datasize --model llama3-8b --num-processes 8
  dlio-ckpt-submit system-yaml --model llama3-8b --hosts node1,node2 --num-processes 8 --results-dir RESULTS
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from dlio_ckpt_ext.submission import code_image, edition, fs_separation, provenance, tree
from dlio_ckpt_ext.config import RunConfig
from dlio_ckpt_ext.result_files import RECORD_FILE
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.executables import find_executable
from dlio_ckpt_ext.redact import redact_args, redact_text, redact_tree
from dlio_ckpt_ext.storage import libraries
from dlio_ckpt_ext.storage.libraries import FORK_LIBRARIES
from dlio_ckpt_ext.report.results import flatten
from dlio_ckpt_ext.tools.presets import compose_config, presets  # noqa: F401 (presets: for callers)



@dataclass
class Submission:
    workload: str
    hosts: list[str]
    ranks_per_host: int
    overrides: list[str] = field(default_factory=list)
    subset_data: Optional[int] = None  # subset mode: data-parallel degree of the full job
    host_ram_gib: Optional[float] = None  # RAM per host as given (default: this host's, measured)
    accelerator: Optional[str] = None  # the simulated accelerator (rules Table 3)

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


def effective_config(sub: Submission, with_user_overrides: bool = True) -> RunConfig:
    """The preset with the overrides, composed by hydra exactly as dlio_benchmark would
    (without the user's overrides: the preset as CLOSED requires it)."""
    return compose_config(sub.workload, sub.all_overrides if with_user_overrides else sub.mode_overrides,
                          sub.ranks, kinds=("_checkpoint",))


def written(cfg: RunConfig) -> dict:
    """Every setting that decides what a run writes: model shape and dtypes,
    parallelism and checkpoint mode, content properties."""
    sections = asdict(cfg.sections)
    return {**{f"model.{k}": v for k, v in flatten(sections["model"]).items() if k not in ("name",)},
            "checkpoint.mode": cfg.checkpoint.mode,
            "checkpoint.layout": cfg.checkpoint.layout,
            "checkpoint.deepspeed_files": cfg.checkpoint.deepspeed_files,
            "streaming.dedup_ratio": cfg.streaming.dedup_ratio,
            "streaming.compress_ratio": cfg.streaming.compress_ratio,
            "streaming.content": cfg.streaming.content}


def same_as_preset(sub: Submission, cfg: RunConfig) -> list[str]:
    """CLOSED: the bytes each rank writes, and their content properties, are
    exactly the unmodified preset's for this process count."""
    preset = effective_config(sub, with_user_overrides=False)
    mine, theirs = written(cfg), written(preset)
    out = [f"{k} is {mine.get(k)!r}; CLOSED requires the preset's {theirs.get(k)!r}"
           for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    for rank in range(sub.ranks):
        got = cfg.layout.rank_plan(cfg.shape, cfg.parallelism, sub.ranks, rank).files
        want = preset.layout.rank_plan(preset.shape, preset.parallelism, sub.ranks, rank).files
        if got != want:
            out.append(f"rank {rank} writes {sum(f.size for f in got)} bytes in {len(got)} files; CLOSED requires "
                       f"the preset's {sum(f.size for f in want)} bytes in {len(want)} files")
            break
    return out


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_closed_rules(sub: Submission, cfg: RunConfig, can_drop_cache: bool, ram_bytes: int) -> list[str]:
    """Every way this run would not be a valid CLOSED submission under rules
    edition 3.0, one line each, starting with the rule's number."""
    out = [f"4.6.3 {v}" for v in same_as_preset(sub, cfg)]
    c = cfg.checkpoint
    out += edition.closed_shape_violations(cfg.model.name, sub.ranks, cfg.parallelism.mode == "subset",
                                           [sub.ranks_per_host] * len(sub.hosts))
    out += edition.closed_checkpoint_violations(c.num_checkpoints_write, c.num_checkpoints_read, c.fsync)
    if not cfg.layout.mlperf_closed:
        out.append(f"4.6.3 checkpoint.layout={c.layout}: CLOSED writes the reference layout (DeepSpeed's, as "
                   f"DLIO does); {cfg.layout.framework}'s is OPEN")
    if cfg.has_tiers:
        out.append(f"4.6.3 tiers.local_root={cfg.tiers.local_root}: CLOSED saves every checkpoint to the storage "
                   "under test, each timed in the foreground; tiered checkpoints (local often, persistent in the "
                   "background) are OPEN")
    if (c.restore, c.share, c.saved_ranks or sub.ranks) != ("own", "none", sub.ranks):
        out.append(f"4.6.3 checkpoint.restore={c.restore}, share={c.share}, saved_ranks={c.saved_ranks}: CLOSED "
                   "reads back each rank's own files (restore=own, share=none, saved at the same ranks); "
                   "other restores are OPEN")
    if c.resume:
        out.append(f"4.6.3 checkpoint.resume={c.resume}: CLOSED reads the checkpoints in turn; a restart's search "
                   "for the newest whole one is OPEN")
    library = object_library(cfg)
    if library not in (None, *FORK_LIBRARIES):
        given = cfg.storage.storage_options.get("storage_library")
        out.append(f"4.6.3 storage.storage_options.storage_library={given}"
                   + (f" ({library})" if given != library else "")
                   + f": CLOSED moves the bytes through a client the reference (MLCommons' DLIO fork) offers, "
                   f"{', '.join(FORK_LIBRARIES)}; {library} is OPEN")
    if not can_drop_cache:
        for i, host in enumerate(sub.hosts):
            ranks = range(i * sub.ranks_per_host, (i + 1) * sub.ranks_per_host)
            written = c.num_checkpoints_write * sum(
                cfg.layout.rank_plan(cfg.shape, cfg.parallelism, sub.ranks, r).total_bytes for r in ranks)
            if written >= 3 * ram_bytes:
                continue
            out.append(f"4.3.1 host {host} writes {written / 2**30:.1f} GiB, less than 3x its RAM "
                       f"({3 * ram_bytes / 2**30:.1f} GiB) and the page cache cannot be dropped (not root)")
    return out


def object_library(cfg: RunConfig) -> Optional[str]:
    """The client library an s3:// run's bytes go through (storage_options.storage_library,
    `framework` resolved for the layout); None off S3."""
    if cfg.storage.storage_type != "s3" or not str(cfg.storage.storage_root).startswith("s3://"):
        return None
    return libraries.resolve(cfg.storage.storage_options.get("storage_library"), cfg.checkpoint.layout)


def checkpoint_root(cfg: RunConfig) -> str:
    from dlio_ckpt_ext.storage import join_root
    return join_root(cfg.storage.storage_root, cfg.checkpoint.checkpoint_folder)


#: rules whose violation makes an OPEN result invalid too
EVERY_DIVISION_RULES = ("4.3.4", "4.4.2")


def check_every_division(sub: Submission, cfg: RunConfig, results: Path) -> list[str]:
    """The rules that make CLOSED and OPEN results alike invalid: 4.3.4 (the
    accelerators hold the checkpoint) and 4.4.2 (checkpoints and results on
    different file systems). No folder is made before the run is decided on:
    the probe links the folders' nearest existing parents, which a folder not
    yet made cannot be mounted apart from."""
    gib = cfg.layout.checkpoint_bytes(cfg.shape, cfg.parallelism, sub.ranks) / 2**30
    out = edition.accelerator_violations(sub.accelerator, sub.ranks, gib)
    evidence = probe_file_systems(cfg, results, make_folders=False)
    if evidence and evidence["same_filesystem"]:
        out.append(f"4.4.2 the checkpoint folder {evidence['data_or_chkpt_path']} and the results folder {results} "
                   "are on the same file system (a hard link between them succeeded)")
    return out


def probe_file_systems(cfg: RunConfig, results: Path, make_folders: bool) -> Optional[dict]:
    """4.4.2's hard-link probe between the checkpoint and results folders (made
    first when `make_folders`, else their nearest existing parents); None for an
    object store, which is exempt."""
    path = fs_separation.local_path(cfg.storage.storage_type, checkpoint_root(cfg))
    if path is None:
        return None
    checkpoints = os.path.abspath(path)
    if not make_folders:
        evidence = fs_separation.probe(fs_separation.existing(checkpoints), fs_separation.existing(str(results)))
        return {**evidence, "data_or_chkpt_path": checkpoints, "results_path": str(results)}
    os.makedirs(checkpoints, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    return fs_separation.probe(checkpoints, str(results))


def parse_hosts(text: str) -> list[str]:
    """--hosts as mpirun will use it: each host once, none empty (a host listed
    twice would put its ranks on one machine while the rules count two)."""
    hosts = [h.strip() for h in text.split(",")]
    for i, host in enumerate(hosts, 1):
        if not host:
            raise ConfigError("--hosts", text, f"comma-separated host names, none empty (entry {i} is empty)")
    repeated = sorted({h for h in hosts if hosts.count(h) > 1})
    if repeated:
        raise ConfigError("--hosts", text, f"each host once (listed more than once: {', '.join(repeated)}); "
                                           "ranks per host go in --ranks-per-host or --num-processes")
    return hosts


def mpirun(sub: Submission, np_per_host: int, command: list[str], extra: list[str]) -> list[str]:
    hosts = ",".join(f"{h}:{np_per_host}" for h in sub.hosts)
    args = [find_executable("mpirun"), "--host", hosts, "-np", str(len(sub.hosts) * np_per_host)]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    if sub.hosts == ["localhost"] and np_per_host > (os.cpu_count() or 1):
        args.append("--oversubscribe")
    if not any(a.startswith(("--bind-to", "--map-by", "-bind-to", "-map-by")) for a in extra):
        # Open MPI binds by default (a core each up to 2 processes, a NUMA domain
        # above): unbound, each rank's generator share is the node's CPUs / its ranks
        args += ["--bind-to", "none"]
    return args + extra + command


def _tee(stream, *sinks) -> threading.Thread:
    def pump():
        for line in iter(stream.readline, ""):
            for sink in sinks:
                sink.write(line)
                sink.flush()
    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def run_logged(cmd: list[str], folder: Path) -> int:
    """Run `cmd` with its console output on the console and in the invocation's
    checkpointing_run.{stdout,stderr}.log (credentials redacted by the run itself)."""
    with open(folder / tree.STDOUT_LOG, "w") as out, open(folder / tree.STDERR_LOG, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        threads = [_tee(proc.stdout, sys.stdout, out), _tee(proc.stderr, sys.stderr, err)]
        code = proc.wait()
        for t in threads:
            t.join()
    return code


def dotted(overrides: list[str]) -> dict[str, Any]:
    """++workload.a.b=v overrides as {"a.b": v} (the metadata's override_parameters)."""
    import yaml
    out = {}
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key.startswith("workload."):
            out[key[len("workload."):]] = yaml.safe_load(value) if value else value
    return out


@dataclass
class Invocation:
    """One DLIO run of the submission: its folder, its record, DLIO's summary and our metadata."""
    folder: Path
    record: dict
    summary: dict
    meta: dict = field(default_factory=dict)

    @property
    def start(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.summary["start"])

    @property
    def end(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.summary["end"])

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()


def gap_violations(write: Invocation, read: Invocation) -> tuple[Optional[float], list[str]]:
    """4.7.1's failover gap (the read invocation's start after the write
    invocation's end, with the rules' fallbacks), and the timing rules broken:
    that gap over 30 s, DLIO's read window starting before the write window
    ended (4.7.1), or the gap between the two folders' runs not shorter than
    the slower run (2.1.24, from summary.json as the checker reads it)."""
    gap, source = edition.failover_gap(write.meta, write.summary, read.meta, read.summary)
    out = edition.failover_violations(gap, source)
    between = (read.start - write.end).total_seconds()
    slower = max(write.duration_s, read.duration_s)
    if between >= slower:
        out.append(f"2.1.24 checkpointingTimestampGap: the gap between the invocations ({between:.1f} s) is not "
                   f"shorter than the slower invocation ({slower:.1f} s)")
    if between < 0:
        out.append(f"4.7.1 checkpointCacheFlushValidation: the read invocation started {-between:.1f} s before "
                   "the write invocation ended")
    return gap, out


@dataclass
class Place:
    """Where the submission goes: <results>/<division>/<org>/results/<system>/..."""
    results: Path
    division: str
    org: str
    system: str

    def model_folder(self, model_name: str) -> Path:
        return tree.model_folder(self.results, self.division, self.org, self.system, model_name)


def left_behind(folder: Path) -> str:
    """What a failed invocation left on the storage, said with its failure."""
    from dlio_ckpt_ext.report.results import ResultsError
    from dlio_ckpt_ext.report.unfinished import describe, run_state
    try:
        state = run_state(folder)
    except ResultsError as exc:
        return f"\n[submit] {exc}"
    return "" if state is None else "\n" + "\n".join(describe(state))


@dataclass
class Evidence:
    """What every timestamp folder of this submission carries besides DLIO's
    files: the code image it points at (layout 3) and the file-system probe."""
    layout: int
    code_image: Optional[str] = None  # tree hash of the pool image
    fs_separation: Optional[dict] = None  # None: object storage (exempt)

    def stamp_folder(self, folder: Path, parameters: dict, checkpoint_root: str, library: Optional[str]) -> dict:
        """Write the folder's evidence; the metadata keys that declare it."""
        if self.fs_separation is not None:
            fs_separation.write(folder, self.fs_separation)
        if self.layout < 3:
            return {}
        code_image.write_pointer(folder, self.code_image)
        tree.write_json(folder / provenance.PROVENANCE_FILE,
                        provenance.stamp(parameters, self.code_image, checkpoint_root, self.layout, library))
        return {"provenance_file": provenance.PROVENANCE_FILE}


def run_invocation(sub: Submission, place: Place, cfg: RunConfig, phase_overrides: list[str],
                   extra: list[str], evidence: Evidence) -> Invocation:
    folder, _ = tree.new_invocation_folder(place.model_folder(cfg.model.name))
    overrides = [*sub.all_overrides, *phase_overrides]
    dlio = [find_executable("dlio_benchmark"), f"workload={sub.workload}", *overrides,
            *tree.hydra_overrides(folder)]
    cmd = mpirun(sub, sub.ranks_per_host, dlio, extra)
    print(f"[submit] invocation {folder.name}: {' '.join(redact_args(cmd))}", flush=True)
    started = time.time()
    code = run_logged(cmd, folder)
    ended = time.time()
    record_path = folder / RECORD_FILE
    if code != 0 or not record_path.exists():
        raise SystemExit(f"[submit] the invocation in {folder} failed (exit code {code}); see its output above "
                         f"and {folder / tree.STDERR_LOG}" + left_behind(folder))
    record = json.loads(record_path.read_text())
    if record.get("status") != "success":  # mpirun's exit code alone does not say (0 after a lost host)
        raise SystemExit(f"[submit] the invocation in {folder} did not complete (status {record.get('status')!r})")
    summary = json.loads((folder / "summary.json").read_text())
    root = record["storage"]["root"]
    with open(folder / tree.STDOUT_LOG, "a") as out:
        out.write("\n" + tree.df_block([root, str(place.results)]) + "\n")
    effective = record["config"]["effective"]
    c = effective["checkpoint"]
    model = tree.model_folder_name(cfg.model.name)
    declared = evidence.stamp_folder(folder, effective, root, object_library(cfg))
    meta = tree.metadata(
        model=model, command="run", start=started, end=ended, num_processes=sub.ranks, division=place.division,
        parameters=effective, override_parameters=redact_tree(dotted(overrides)),
        args={"model": model, "num_processes": sub.ranks, "hosts": sub.hosts, "checkpoint_folder": root,
              "results_dir": str(place.results), "num_checkpoints_write": c["num_checkpoints_write"],
              "num_checkpoints_read": c["num_checkpoints_read"], "client_host_memory_in_gb": sub.host_ram_gib,
              "accelerator_type": sub.accelerator, "checkpoint_subset": c["mode"] == "subset",
              "data_access_protocol": "file" if evidence.fs_separation is not None else "object"},
        metrics=summary.get("metric", {}), hosts=record.get("hosts", sub.hosts), accelerator=sub.accelerator,
        exit_status=code, restore={"pattern": c.get("restore", "own"), "share": c.get("share", "none"),
                                   "saved_ranks": c.get("saved_ranks") or sub.ranks}, **declared)
    tree.write_json(tree.metadata_path(folder), meta)
    return Invocation(folder, record, summary, meta)


def run_submission(sub: Submission, place: Place, cfg: RunConfig, violations: list[str], extra: list[str],
                   evidence: Evidence) -> int:
    c = cfg.checkpoint
    place.results.mkdir(parents=True, exist_ok=True)
    tree.mark_results_dir(place.results, place.org)
    if evidence.layout >= 3:
        evidence.code_image = code_image.capture(place.results)
        print(f"[submit] code image {code_image.POOL_DIR}/code-{evidence.code_image[:8]} "
              f"({code_image.pointer(evidence.code_image)})", flush=True)
    write = run_invocation(sub, place, cfg, ["++workload.checkpoint.num_checkpoints_read=0"], extra, evidence)
    dropped, cache_note = drop_caches(sub, extra)
    print(f"[submit] {cache_note}", flush=True)
    read = run_invocation(sub, place, cfg, ["++workload.checkpoint.num_checkpoints_write=0",
                                            f"++workload.checkpoint.num_checkpoints_read={c.num_checkpoints_read}"],
                          extra, evidence)
    gap, timing = gap_violations(write, read)
    invalid = [v for v in violations if v.startswith(EVERY_DIVISION_RULES)]
    model_folder = place.model_folder(cfg.model.name)
    report = {"workload": sub.workload, "model": tree.model_folder_name(cfg.model.name), "division": place.division,
              "org": place.org, "system": place.system, "hosts": sub.hosts, "ranks_per_host": sub.ranks_per_host,
              "ranks": sub.ranks, "overrides": redact_args(sub.all_overrides), "accelerator": sub.accelerator,
              "rules_edition": edition.RULES_EDITION, "layout_version": evidence.layout,
              "valid": not (timing or invalid), "closed_rule_violations": violations,
              "timing_rule_violations": timing, "page_cache_dropped": dropped, "cache_note": cache_note,
              "read_start_after_write_s": gap,
              "invocation_seconds": {"write": write.duration_s, "read": read.duration_s},
              "save": {k: write.record["save"][k] for k in ("throughput_gib_s_mean", "throughput_gib_s_std",
                                                            "duration_s_mean", "duration_s_std")},
              "load": {k: read.record["load"][k] for k in ("throughput_gib_s_mean", "throughput_gib_s_std",
                                                           "duration_s_mean", "duration_s_std")},
              "invocations": {"write": write.folder.name, "read": read.folder.name},
              "finished_at": time.time()}
    tree.write_json(model_folder / tree.RESULTS_FILE, report)
    if evidence.layout >= 3:
        provenance.write_manifest(place.results, place.division, place.org, evidence.layout)
    print(f"[submit] the read invocation started {gap:.1f} s after the write invocation ended (its "
          f"invocation_start_time - the write's invocation_end_time; the rules: at most "
          f"{edition.FAILOVER_GAP_LIMIT_S:.0f} s, and DLIO's windows apart by less than the slower invocation, "
          f"{max(write.duration_s, read.duration_s):.1f} s)", flush=True)
    for v in timing:
        print(f"[submit] timing rule broken: {v}", file=sys.stderr, flush=True)
    broken = "; ".join((["timing rules broken"] if timing else [])
                       + ([f"rules broken: {', '.join(v.split()[0] for v in invalid)}"] if invalid else []))
    print(f"[submit] {place.division.upper()}{'' if report['valid'] else f' (INVALID: {broken})'}: save "
          f"{report['save']['throughput_gib_s_mean']:.4f} GiB/s, load {report['load']['throughput_gib_s_mean']:.4f} "
          f"GiB/s; {model_folder / tree.RESULTS_FILE}", flush=True)
    return 0 if report["valid"] else 1


def drop_caches(sub: Submission, extra: list[str]) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root: page cache not dropped; reads use O_DIRECT or posix_fadvise(DONTNEED)"
    cmd = mpirun(sub, 1, [sys.executable, "-m", "dlio_ckpt_ext.submission.dropcache"], extra)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return False, f"page cache not dropped ({res.stderr.strip().splitlines()[-1:]}); reads rely on O_DIRECT"
    # one line per host from dropcache ("node1: page cache dropped"): the hosts it really ran on
    dropped_on = sorted(line.split(":", 1)[0] for line in res.stdout.splitlines() if line.endswith("page cache dropped"))
    return True, f"page cache dropped on every host ({', '.join(dropped_on)}; sync; echo 3 > /proc/sys/vm/drop_caches)"


def datasize(sub: Submission, cfg: RunConfig, ram: int) -> None:
    """mlpstorage's `checkpointing datasize`, from the plan's exact bytes."""
    c = cfg.checkpoint
    per_rank = [cfg.layout.rank_plan(cfg.shape, cfg.parallelism, sub.ranks, r).total_bytes for r in range(sub.ranks)]
    total = sum(per_rank)
    print(f"[submit] {sub.workload}: {sub.ranks} processes on {len(sub.hosts)} host(s), "
          f"{sub.ranks_per_host} per host")
    for r, n in enumerate(per_rank):
        print(f"  rank {r}: {n} bytes ({n / 2**30:.2f} GiB) per checkpoint")
    for i, host in enumerate(sub.hosts):
        n = sum(per_rank[i * sub.ranks_per_host:(i + 1) * sub.ranks_per_host])
        written = n * c.num_checkpoints_write
        print(f"  host {host}: {n} bytes ({n / 2**30:.2f} GiB) per checkpoint, {written} bytes "
              f"({written / 2**30:.2f} GiB) in {c.num_checkpoints_write} writes; "
              f"{'at least' if written >= 3 * ram else 'less than'} 3x its memory ({3 * ram / 2**30:.2f} GiB), "
              "which the rules ask for when the page cache cannot be dropped")
    print(f"  per checkpoint: {total} bytes ({total / 2**30:.2f} GiB)")
    print(f"  capacity for {c.num_checkpoints_write} checkpoints: {total * c.num_checkpoints_write} bytes "
          f"({total * c.num_checkpoints_write / 2**30:.2f} GiB)")


def system_yaml(hosts: list[str], place: Optional[Place], system: str, ram: int) -> None:
    """A skeleton systems/<system>.yaml: measured client facts, placeholders for the rest."""
    text = tree.system_yaml(system, hosts, round(ram / 2**30), os.cpu_count() or 1)
    if place is None:
        print(text, end="")
        return
    path = place.results / place.division / place.org / "systems" / f"{system}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    listed = ""
    if (path.parent.parent / provenance.MANIFEST_FILE).is_file():  # a layout-3 tree: keep its inventory whole
        provenance.write_manifest(place.results, place.division, place.org, edition.DEFAULT_LAYOUT)
        listed = f" (listed in {provenance.MANIFEST_FILE}; run `dlio-ckpt-submit manifest` after adding the PDF)"
    print(f"[submit] wrote {path}{listed}: replace every '{tree.PLACEHOLDER}' before submitting and add "
          f"{path.stem}.pdf beside it")


def manifest(place: Place, layout: int) -> int:
    """Rewrite <division>/<org>/submission.yaml from the tree (after adding a
    system's PDF, or removing a run folder)."""
    if layout < 3:
        print(f"[submit] layout version {layout} has no {provenance.MANIFEST_FILE}", file=sys.stderr)
        return 2
    org_dir = place.results / place.division / place.org
    if not org_dir.is_dir():
        print(f"[submit] no submission at {org_dir}", file=sys.stderr)
        return 2
    path = provenance.write_manifest(place.results, place.division, place.org, layout)
    print(f"[submit] wrote {path}: {len(provenance.run_leaves(org_dir))} run folders")
    for image in provenance.unreferenced_images(place.results):
        print(f"[submit] {image} is a code image no run folder points at (the checker fails it, CHECK-03): "
              "remove it", file=sys.stderr)
    return 0


COMMANDS = ("run", "datasize", "system-yaml", "manifest")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dlio-ckpt-submit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.epilog = ("commands (first argument): run (default): the submission; datasize: bytes per rank, host "
                 "and checkpoint; system-yaml: a skeleton systems/<system>.yaml (to --results-dir, or stdout); "
                 "manifest: rewrite <division>/<org>/submission.yaml from the tree")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--workload", help="a checkpoint preset, e.g. llama3_8b_checkpoint")
    what.add_argument("--model", choices=list(tree.MODEL_FOLDERS.values()), help="mlpstorage's name of the preset")
    ap.add_argument("--hosts", default="localhost", help="comma-separated host names (default localhost)")
    procs = ap.add_mutually_exclusive_group()
    procs.add_argument("--ranks-per-host", type=int)
    procs.add_argument("--num-processes", "-np", type=int, help="all ranks (mlpstorage's name): split evenly "
                                                                "over --hosts")
    ap.add_argument("--subset-data", type=int, help="subset mode: data-parallel degree of the full job")
    ap.add_argument("--results-dir", "-rd", help="default results/<workload>-<UTC time>")
    ap.add_argument("--org", default="my_org", help="the submitter's organisation (folder name)")
    ap.add_argument("--system", "--systemname", default="my_system", help="the system's name (folder name)")
    ap.add_argument("--checkpoint-folder", "-cf", help="where the checkpoints go (checkpoint.checkpoint_folder)")
    ap.add_argument("--num-checkpoints-write", "-ncw", type=int)
    ap.add_argument("--num-checkpoints-read", "-ncr", type=int)
    ap.add_argument("--open", action="store_true", help="run even if CLOSED rules are broken (placed as OPEN)")
    ap.add_argument("--accelerator-type", "-g", choices=list(edition.ACCELERATOR_MEMORY_GB),
                    help="the simulated accelerator, recorded in the metadata (rules 4.3.4, Table 3: b200 and mi355; "
                         "h100 and a100 are whatif only)")
    ap.add_argument("--rules-edition", default=edition.RULES_EDITION, choices=[edition.RULES_EDITION],
                    help="the rules edition the submission is made under (recorded in provenance.json and "
                         "submission.yaml)")
    ap.add_argument("--layout-version", type=int, default=edition.DEFAULT_LAYOUT, choices=edition.LAYOUT_VERSIONS,
                    help="3 (default): the code-image pool, .mlps-code-image, provenance.json and submission.yaml "
                         "the current checker reads; 2: the tree of mlpstorage <= 3.0.26, without them")
    ap.add_argument("--skip-fs-separation-gate", action="store_true",
                    help="run although checkpoints and results share a file system (a development run: the "
                         "result is recorded as invalid, rule 4.4.2)")
    ap.add_argument("--host-ram-gib", "--client-host-memory-in-gb", "-cm", type=float,
                    help="RAM per host (default: this host's)")
    ap.add_argument("--mpirun-arg", action="append", default=[], help="extra mpirun argument (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="check the rules and print the commands")
    ap.add_argument("overrides", nargs="*", help="after --: hydra overrides for both invocations")
    return ap


def submission_from(args) -> Submission:
    workload = args.workload or tree.preset_for_model(args.model)
    if not workload:
        raise ConfigError("--workload", None, "a checkpoint preset (or --model llama3-8b, ...)")
    hosts = parse_hosts(args.hosts)
    if args.num_processes is not None:
        if args.num_processes < 1 or args.num_processes % len(hosts):
            raise ConfigError("--num-processes", args.num_processes,
                              f"a positive multiple of the {len(hosts)} host(s) in --hosts")
        per_host = args.num_processes // len(hosts)
    elif args.ranks_per_host is not None:
        per_host = args.ranks_per_host
    else:
        raise ConfigError("--ranks-per-host", None, "a positive integer (or --num-processes)")
    if per_host < 1:
        raise ConfigError("--ranks-per-host", per_host, "a positive integer")
    overrides = list(args.overrides)
    for key, value in (("checkpoint_folder", args.checkpoint_folder),
                       ("num_checkpoints_write", args.num_checkpoints_write),
                       ("num_checkpoints_read", args.num_checkpoints_read)):
        if value is not None:
            overrides.append(f"++workload.checkpoint.{key}={value}")
    return Submission(workload, hosts, per_host, overrides, args.subset_data,
                      args.host_ram_gib, args.accelerator_type)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "run"
    args = parser().parse_args(argv)
    if command == "system-yaml":
        try:
            hosts = parse_hosts(args.hosts)
        except ConfigError as exc:
            print(f"[submit] {exc}", file=sys.stderr)
            return 2
        ram = int(args.host_ram_gib * 2**30) if args.host_ram_gib else host_ram_bytes()
        place = Place(Path(args.results_dir).resolve(), "open" if args.open else "closed", args.org,
                      args.system) if args.results_dir else None
        system_yaml(hosts, place, args.system, ram)
        return 0
    if command == "manifest":
        if not args.results_dir:
            print("[submit] invalid config: --results-dir=None; allowed: the submission's results folder",
                  file=sys.stderr)
            return 2
        return manifest(Place(Path(args.results_dir).resolve(), "open" if args.open else "closed", args.org,
                              args.system), args.layout_version)
    try:
        sub = submission_from(args)
        cfg = effective_config(sub)
        if cfg.is_model_load:
            raise ConfigError("--workload", sub.workload, "a checkpointing preset: a model load (published "
                              "safetensors read by serving replicas) is no MLPerf Storage workload; run it with "
                              "dlio_benchmark")
        find_executable("mpirun")
    except (ConfigError, FileNotFoundError) as exc:
        print(redact_text(f"[submit] {exc}"), file=sys.stderr)
        return 2
    ram = int(sub.host_ram_gib * 2**30) if sub.host_ram_gib else host_ram_bytes()
    if command == "datasize":
        datasize(sub, cfg, ram)
        return 0
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results = Path(args.results_dir or f"results/{sub.workload}-{stamp}").resolve()
    try:
        refused = check_every_division(sub, cfg, results)
    except OSError as exc:
        print(redact_text(f"[submit] 4.4.2 {exc.strerror}"), file=sys.stderr)
        return 2
    violations = check_closed_rules(sub, cfg, os.geteuid() == 0, ram)
    for v in violations:
        print(f"[submit] CLOSED rule: {v}", flush=True)
    gate = [v for v in refused if not (v.startswith("4.4.2") and args.skip_fs_separation_gate)]
    for v in refused:
        print(f"[submit] rule for CLOSED and OPEN: {v}", file=sys.stderr if v in gate else sys.stdout, flush=True)
    if gate:
        print("[submit] not a valid run in any division; fix the above"
              + (" (--skip-fs-separation-gate runs a development run anyway)" if any(
                  v.startswith("4.4.2") for v in gate) else ""), file=sys.stderr)
        return 2
    if violations and not args.open:
        print("[submit] not a valid CLOSED run; fix the above or pass --open to run it as OPEN", file=sys.stderr)
        return 2
    violations += refused
    place = Place(results, "open" if (violations or args.open) else "closed", args.org, args.system)
    if args.dry_run:
        print(f"[submit] checked: the preset and overrides compose ({sub.workload}), the shard plan of each of "
              f"{sub.ranks} ranks against the unmodified preset's, process count, checkpoints, fsync, ranks per "
              f"host ({sub.ranks_per_host} on each of {', '.join(sub.hosts)}), data per host against its RAM, "
              f"{sub.ranks} x {sub.accelerator}'s memory against the checkpoint, the file systems of the "
              f"checkpoints and the results: "
              f"{'no CLOSED rule broken' if not violations else f'{len(violations)} CLOSED rule(s) broken'}")
        folder = place.model_folder(cfg.model.name) / "<YYYYMMDD_HHmmss>"
        for phase in (["++workload.checkpoint.num_checkpoints_read=0"],
                      ["++workload.checkpoint.num_checkpoints_write=0"]):
            dlio = ["dlio_benchmark", f"workload={sub.workload}", *sub.all_overrides, *phase,
                    *tree.hydra_overrides(folder)]
            print(f"[submit] would run: {' '.join(redact_args(mpirun(sub, sub.ranks_per_host, dlio, args.mpirun_arg)))}")
        print(f"[submit] would place it as {place.division.upper()} under {place.model_folder(cfg.model.name)}")
        return 0
    probed = probe_file_systems(cfg, results, make_folders=True)  # the evidence each folder keeps
    return run_submission(sub, place, cfg, violations, args.mpirun_arg, Evidence(args.layout_version, None, probed))


if __name__ == "__main__":
    sys.exit(main())
