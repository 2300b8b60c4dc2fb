"""The checkpoint-only workflow DLIO 2.0.0 lacks.

It has DLIOBenchmark's interface (constructed from the workload config, then
initialize, run, finalize) so DLIO's own `dlio_benchmark` entry point, hydra
app and MPI runner drive it; the callback swaps it in for DLIOBenchmark.
The mechanism is resolved by DLIO's own checkpoint_mechanism_classname code,
and a fallback to DLIO's built-in mechanism is refused, not run.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import sys
import time
from dataclasses import asdict

from dlio_benchmark.checkpointing.checkpointing_factory import CheckpointingFactory
from dlio_benchmark.utils.config import ConfigArguments, LoadConfig
from dlio_benchmark.utils.utility import DLIOMPI
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from dlio_ckpt_ext.checkpointer import inventory_error
from dlio_ckpt_ext.config import MECHANISM_CLASS, load_config
from dlio_ckpt_ext.dlio import metrics, provenance
from dlio_ckpt_ext.dlio.mechanism import StreamingCheckpointing
from dlio_ckpt_ext.dlio.mpi import abort, user_terminal
from dlio_ckpt_ext.engine.profile import phase_report, phase_totals
from dlio_ckpt_ext.engine.threads import usable_cpus
from dlio_ckpt_ext.errors import ConfigError

SECRET_WORDS = ("secret", "password", "token", "credential", "access_key", "session")


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in SECRET_WORDS)


def redact(options: dict) -> dict:
    """Storage options with credentials replaced, for anything we write out."""
    return {k: ("<redacted>" if _secret(k) else v) for k, v in options.items()}


def redact_args(argv: list[str]) -> list[str]:
    """A command line with the values of credential overrides replaced."""
    return [f"{a.split('=', 1)[0]}=<redacted>" if "=" in a and _secret(a.split("=", 1)[0]) else a for a in argv]


class CheckpointOnlyBenchmark:
    def __init__(self, cfg: DictConfig) -> None:
        self.comm = DLIOMPI.get_instance().comm()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.workload = cfg
        try:
            self.run_config = load_config(cfg, self.size)
        except ConfigError as exc:
            # Every rank validates the same config, so every rank stops here
            # together: a clean exit, no abort needed.
            if self.rank == 0:
                sys.stderr.write(f"[ERROR] {exc}\n")
            raise SystemExit(2) from None
        with self._abort_on_error("reading the workload config"):
            self.args = ConfigArguments.get_instance()
            LoadConfig(self.args, cfg)
            self.args.my_rank, self.args.comm_size = self.rank, self.size
            self.output_folder = self._agree_output_folder(self.args.output_folder)
        self.mechanism: StreamingCheckpointing | None = None
        self.windows: dict[str, list[dict]] = {"save": [], "load": []}
        self.local: dict[str, list[dict]] = {"save": [], "load": []}
        self.inventory: dict | None = None

    @contextlib.contextmanager
    def _abort_on_error(self, what: str):
        try:
            yield
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure must end every rank
            abort(self.comm, f"{what} failed: {exc}", exc)

    def _agree_output_folder(self, mine: str) -> str:
        """Hydra's ${now:...} run dir can differ between ranks: use rank 0's
        and drop the other ranks' empty ones."""
        mine = os.path.abspath(mine)
        chosen = self.comm.bcast(mine if self.rank == 0 else None, root=0)
        if mine != chosen and os.path.isdir(mine) and set(os.listdir(mine)) <= {".hydra"}:
            shutil.rmtree(mine, ignore_errors=True)
        if self.rank == 0:
            os.makedirs(chosen, exist_ok=True)
        self.comm.barrier()
        return chosen

    # -- DLIOBenchmark interface -------------------------------------------
    def initialize(self) -> None:
        with self._abort_on_error("loading the checkpoint mechanism"):
            self.args.derive_configurations()
            cls = self.args.checkpoint_mechanism_class
            if cls is None or not issubclass(cls, StreamingCheckpointing):
                raise ConfigError("workload.checkpoint.checkpoint_mechanism_classname",
                                  self.args.checkpoint_mechanism_classname,
                                  f"{MECHANISM_CLASS} or a subclass (DLIO would otherwise fall back "
                                  "to its built-in mechanism)")
            self.mechanism = CheckpointingFactory().get_mechanism(self.args.checkpoint_mechanism)
            if not isinstance(self.mechanism, StreamingCheckpointing):
                raise ConfigError("workload.checkpoint.checkpoint_mechanism_classname",
                                  self.args.checkpoint_mechanism_classname,
                                  f"a class DLIO resolves to {MECHANISM_CLASS}; it built "
                                  f"{type(self.mechanism).__name__} instead")
        if self.rank == 0:
            with self._abort_on_error("checking the storage"):
                self.mechanism.checkpointer.backend.probe()
        self.comm.barrier()
        if self.rank == 0:
            ck = self.mechanism.checkpointer
            total = ck.checkpoint_bytes()
            print(f"[INFO] streaming checkpoint: model {self.run_config.model.name}, {self.size} ranks on "
                  f"{self.mechanism.topology.num_hosts} host(s), {total} bytes "
                  f"({total / metrics.GiB:.2f} GiB) per checkpoint to {ck.backend.uri('').rstrip('/')}", flush=True)

    def run(self) -> None:
        c = self.run_config.checkpoint
        self.start_time = time.time()
        self._phase("save", c.num_checkpoints_write, self.mechanism.save_checkpoint)
        self.comm.barrier()
        # After writing, check what was written; in a read-only run (checkpoints
        # an earlier run wrote), check that what is about to be read is there.
        self._check_inventory(list(range(1, max(c.num_checkpoints_write, c.num_checkpoints_read) + 1)))
        self._phase("load", c.num_checkpoints_read, self.mechanism.load_checkpoint)
        self.comm.barrier()
        self.end_time = time.time()

    def _phase(self, phase: str, count: int, action) -> None:
        c = self.run_config.checkpoint
        for step in range(1, count + 1):
            if c.time_between_checkpoints > 0:
                time.sleep(c.time_between_checkpoints)  # idle compute time: outside the window
            if c.rank_sync:
                self.comm.barrier()
            with self._abort_on_error(f"checkpoint {phase} {step}"), self._progress(phase, step, count) as bar:
                start = time.time()
                files = action(1, step, bar)
                end = time.time()
            record = metrics.local_record(step, files, start, end)
            self.local[phase].append(record)
            gathered = self.comm.gather({k: v for k, v in record.items() if k != "files"}, root=0)
            if self.rank == 0:
                window = metrics.global_window(gathered)
                self.windows[phase].append(window)
                print(f"[INFO] checkpoint {phase} {step}/{count}: {window['bytes'] / metrics.GiB:.3f} GiB in "
                      f"{window['duration_s']:.4f} s = {window['throughput_gib_s']:.4f} GiB/s", flush=True)

    @contextlib.contextmanager
    def _progress(self, phase: str, step: int, count: int):
        """Rank 0's own bytes of this checkpoint, with rate and ETA, on a terminal
        only (a log file gets the [INFO] lines). Updated from the I/O thread once
        per chunk; its cost is measured by bench/engine_bench.py."""
        term = user_terminal() if self.rank == 0 else None
        if term is None:
            yield None
            return
        ck = self.mechanism.checkpointer
        total = ck.rank_bytes(ck.rank if phase == "save" else ck.source_rank())
        try:
            width = os.get_terminal_size(term.fileno()).columns or 100
        except OSError:
            width = 100
        try:
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False, file=term,
                      ncols=width, desc=f"rank 0 {phase} {step}/{count}") as bar:
                yield bar.update
        finally:
            if term is not sys.stdout:
                term.close()

    def _check_inventory(self, steps: list[int]) -> None:
        """Rank 0 lists once and compares with the plan; nobody else lists."""
        result = None
        if self.rank == 0:
            with self._abort_on_error("listing the written checkpoints"):
                result = self.mechanism.checkpointer.inventory(steps)
            print(f"[INFO] inventory: {result['message']}", flush=True)
        self.inventory = self.comm.bcast(result, root=0)
        if not self.inventory["ok"] and self.rank == 0:
            abort(self.comm, str(inventory_error(self.inventory)))

    def finalize(self) -> None:
        with self._abort_on_error("writing the results"):
            self._write_results()
        self.comm.barrier()
        if not self.run_config.checkpoint.keep_files and self.rank == 0:
            self.mechanism.checkpointer.remove_all()
        self.mechanism.finalize()
        self.comm.barrier()

    # -- results -------------------------------------------------------------
    def _write_results(self) -> None:
        mech = self.mechanism
        ck = mech.checkpointer
        rank_dir = os.path.join(self.output_folder, "rank_stats")
        os.makedirs(rank_dir, exist_ok=True)
        totals = {p: phase_totals([f for (_, fs) in mech.records[p] for f in fs]) for p in self.local}
        metrics.write_json(os.path.join(rank_dir, f"rank_{self.rank:05d}.json"), {
            "rank": self.rank, "hostname": os.uname().nodename, "local_rank": mech.topology.local_rank,
            "ranks_per_node": mech.topology.ranks_per_node, "gen_threads": ck.gen_threads,
            "source_rank_for_loads": ck.source_rank(), "phases": self.local, "totals": totals})
        gathered = self.comm.gather(totals, root=0)
        if self.rank != 0:
            return
        reports = {p: phase_report([g[p] for g in gathered]) for p in self.local}
        lines = []
        for phase in ("save", "load"):
            if self.windows[phase]:
                lines += metrics.metric_lines(phase, self.windows[phase])
        for phase in ("save", "load"):
            lines += metrics.results_block(phase, reports[phase])
        if self.windows["load"] and ck.backend.reads_may_be_cached:
            lines.append("[WARNING] reads may have been served from the page cache "
                         f"(read cache method: {ck.backend.read_cache_method})")
        print("\n".join(lines), flush=True)
        metrics.write_json(os.path.join(self.output_folder, "summary.json"), self._summary(reports))
        print(f"[INFO] results in {self.output_folder}", flush=True)

    def _manifest(self) -> dict:
        """What makes two results comparable: code, environment and settings."""
        mech, rc = self.mechanism, self.run_config
        ck, topo = mech.checkpointer, mech.topology
        return {"versions": provenance.versions(), "git_commit": provenance.git_commit(),
                "command": redact_args(sys.argv), "model": rc.model.name,
                "start_time": self.start_time, "end_time": self.end_time,
                "start_time_utc": _utc(self.start_time), "end_time_utc": _utc(self.end_time),
                "ranks": self.size, "hosts": list(topo.hosts), "num_hosts": topo.num_hosts,
                "ranks_per_node": topo.ranks_per_node,
                "threads": {"gen_threads_per_rank": ck.gen_threads, "usable_cpus": usable_cpus()},
                "storage": ck.backend.describe(),
                "cache_method": ck.backend.read_cache_method,
                "reads_may_be_cached": ck.backend.reads_may_be_cached}

    def _effective_config(self) -> tuple[dict, dict]:
        """Our validated sections and DLIO's whole workload, credentials redacted."""
        sections = asdict(self.run_config.sections)
        sections["storage"]["storage_options"] = redact(sections["storage"]["storage_options"])
        workload = OmegaConf.to_container(self.workload, resolve=True)
        if "storage" in workload and "storage_options" in workload["storage"]:
            workload["storage"]["storage_options"] = redact(dict(workload["storage"]["storage_options"]))
        return sections, workload

    def _summary(self, reports: dict) -> dict:
        ck = self.mechanism.checkpointer
        size = ck.checkpoint_bytes()
        manifest = self._manifest()
        sections, workload = self._effective_config()
        metrics.write_json(os.path.join(self.output_folder, "manifest.json"), manifest)
        with open(os.path.join(self.output_folder, "effective_config.yaml"), "w") as fh:
            fh.write(OmegaConf.to_yaml({"workload": workload}))
        out = {"status": "success", "benchmark": "dlio-ckpt-ext streaming checkpoint",
               "checkpoint_bytes": size, "checkpoint_gib": size / metrics.GiB,
               **manifest, "inventory": self.inventory,
               "config": {"effective": sections, "workload": workload}}
        for phase in ("save", "load"):
            w = self.windows[phase]
            d_mean, d_std = metrics.mean_std([x["duration_s"] for x in w])
            t_mean, t_std = metrics.mean_std([x["throughput_gib_s"] for x in w])
            out[phase] = {"checkpoints": len(w), "duration_s_mean": d_mean, "duration_s_std": d_std,
                          "throughput_gib_s_mean": t_mean, "throughput_gib_s_std": t_std,
                          "per_checkpoint": w, "results": reports[phase]}
        return out


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")
