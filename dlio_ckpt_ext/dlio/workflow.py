"""The checkpoint-only workflow DLIO 2.0.0 lacks, modelled on upstream DLIO's.

It has DLIOBenchmark's interface (constructed from the workload config, then
initialize, run, finalize) so DLIO's own `dlio_benchmark` entry point, hydra
app and MPI runner drive it; the callback swaps it in for DLIOBenchmark.
Like upstream's loop it gets its storage from DLIO's StorageFactory, starts
DLIO's logging, tracer and profiler, resolves the mechanism with DLIO's own
checkpoint_mechanism_classname code (a fallback to DLIO's built-in mechanism
is refused, not run), times each checkpoint as upstream does (barrier, save,
barrier when rank_sync), counts the checkpoints with walk_node before
reading, and writes DLIO's result files in upstream's schema.
"""
from __future__ import annotations

import contextlib
import os
import time

import psutil
from dlio_benchmark.checkpointing.checkpointing_factory import CheckpointingFactory
from dlio_benchmark.storage.storage_factory import StorageFactory
from dlio_benchmark.utils.config import ConfigArguments, LoadConfig
from dlio_benchmark.utils.utility import DLIOMPI
from omegaconf import DictConfig

from dlio_ckpt_ext.config import MECHANISM_CLASS
from dlio_ckpt_ext.dlio import dlio_schema, trace
from dlio_ckpt_ext.result_files import write_json
from dlio_ckpt_ext.dlio.mechanism import StreamingCheckpointing
from dlio_ckpt_ext.dlio.mpi import abort
from dlio_ckpt_ext.errors import ConfigError, StorageError


class CheckpointOnlyBenchmark:
    def __init__(self, cfg: DictConfig) -> None:
        self.comm = DLIOMPI.get_instance().comm()
        self.rank, self.size = self.comm.rank, self.comm.size
        with self._abort_on_error("reading the workload config"):
            self.args = ConfigArguments.get_instance()
            LoadConfig(self.args, cfg)
            self.args.my_rank, self.args.comm_size = self.rank, self.size
            self.storage = StorageFactory().get_storage(self.args.storage_type, self.args.storage_root,
                                                        self.args.framework)
            os.makedirs(self.args.output_folder, exist_ok=True)
            if self.rank == 0 and os.path.isfile(self.args.logfile_path):
                os.remove(self.args.logfile_path)
            self.comm.barrier()
            self.args.configure_dlio_logging(is_child=False)
            self.dftracer = self.args.configure_dftracer(is_child=False, use_pid=False)
            self.profiler = None
            if self.args.do_profiling:
                from dlio_benchmark.profiler.profiler_factory import ProfilerFactory
                self.profiler = ProfilerFactory().get_profiler(self.args.profiler)
        self.mechanism: StreamingCheckpointing | None = None
        #: this rank's DLIO-style timing of each checkpoint: (start, end)
        self.timings: dict[str, list[tuple[float, float]]] = {"save": [], "load": []}
        self.start_time = self.end_time = time.time()

    @contextlib.contextmanager
    def _abort_on_error(self, what: str):
        try:
            yield
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure must end every rank
            abort(self.comm, f"{what} failed: {exc}", exc)

    # -- DLIOBenchmark interface -------------------------------------------
    # Each step is a span named and filed as upstream's (category
    # dlio_benchmark), so both DLIOs' traces read alike in the analysers.
    def initialize(self) -> None:
        with trace.span("DLIOBenchmark.initialize", trace.APP):
            self._initialize()

    def _initialize(self) -> None:
        self.comm.barrier()
        if self.profiler is not None:
            self.profiler.start()
        with self._abort_on_error("loading the checkpoint mechanism"):
            self.args.derive_configurations()
            self.mechanism = CheckpointingFactory().get_mechanism(self.args.checkpoint_mechanism)
            if not isinstance(self.mechanism, StreamingCheckpointing):
                raise ConfigError("workload.checkpoint.checkpoint_mechanism_classname",
                                  self.args.checkpoint_mechanism_classname,
                                  f"a class DLIO resolves to {MECHANISM_CLASS}; it built "
                                  f"{type(self.mechanism).__name__} instead")
        self.comm.barrier()

    def run(self) -> None:
        with trace.span("DLIOBenchmark._checkpoint", trace.APP):
            self._run()

    def _run(self) -> None:
        c = self.mechanism.session.config.checkpoint
        self.start_time = time.time()
        with trace.span("DLIOBenchmark._checkpoint_write", trace.APP):
            self._phase("save", c.num_checkpoints_write, self.mechanism.save_checkpoint)
        # Rank 0 counts for all (upstream's loop walks on every rank: at 1024
        # ranks, 1024 listings of the same folder); the others wait for its answer.
        self.mechanism.session.drain()
        self.comm.barrier()
        with self._abort_on_error("counting the checkpoints"):
            present = self.comm.bcast(len(self.storage.walk_node(self.args.checkpoint_folder))
                                      if self.rank == 0 else None, root=0)
            needed = max(self.mechanism.session.config.steps_read(), default=0)
            if present < needed:
                raise StorageError(f"{needed} checkpoints to read but {present} present in "
                                   f"{self.storage.get_uri(self.args.checkpoint_folder)}")
        with trace.span("DLIOBenchmark._checkpoint_read", trace.APP):
            self._phase("load", c.num_checkpoints_read, self.mechanism.load_checkpoint)
        self.end_time = time.time()

    def _phase(self, phase: str, count: int, action) -> None:
        c = self.mechanism.session.config.checkpoint
        size_gib = self.mechanism.checkpoint_size
        for step in range(1, count + 1):
            if c.time_between_checkpoints > 0:
                time.sleep(c.time_between_checkpoints)  # the "training" between checkpoints: untimed
            self.comm.barrier()
            start = time.time()
            action(1, step)
            if c.rank_sync:
                self.comm.barrier()
            end = time.time()
            self.timings[phase].append((start, end))
            if self.rank == 0 and phase == "save" and self.mechanism.session.config.is_async:
                how = ("tiers: its local save, and staging where it is also persistent" if
                       self.mechanism.session.config.has_tiers else "async")
                print(f"[INFO] checkpoint {phase} {step}/{count}: returned after {end - start:.4f} s (rank 0's "
                      f"time; {how}: persisting goes on in the background)", flush=True)
            elif self.rank == 0 and phase == "load" and self.mechanism.session.config.recovers:
                print(f"[INFO] checkpoint recovery {step}/{count}: returned after {end - start:.4f} s (rank 0's time; "
                      "RECOVERY says which tier served it and the time to resume)", flush=True)
            elif self.rank == 0:
                print(f"[INFO] checkpoint {phase} {step}/{count}: {size_gib:.3f} GiB in {end - start:.4f} s "
                      f"= {size_gib / (end - start):.4f} GiB/s (rank 0's time)", flush=True)

    def finalize(self) -> None:
        with trace.span("DLIOBenchmark.finalize", trace.APP):
            self.comm.barrier()
            self.mechanism.finalize()
            if self.profiler is not None:
                self.profiler.stop()
            with self._abort_on_error("writing DLIO's result files"):
                self._write_dlio_results()
            self.comm.barrier()
        self.args.finalize_dftracer(self.dftracer)

    def _write_dlio_results(self) -> None:
        session = self.mechanism.session
        folder = session.output_folder
        gib = self.mechanism.checkpoint_size
        dlio_schema.write_rank_files(folder, self.rank, self.start_time, self.end_time, self.timings, gib)
        # one entry per host, from its first local rank, as upstream's StatsCounter
        node_info = (psutil.virtual_memory().total / 2**30, psutil.cpu_count()) \
            if session.topology.local_rank == 0 else None
        hosts = [h for h in self.comm.gather(node_info, root=0) or [] if h is not None]
        if self.rank == 0:
            summary = dlio_schema.summary(self.start_time, self.end_time, self.size, session.topology.num_hosts,
                                          [m for m, _ in hosts], [int(c) for _, c in hosts],
                                          session.windows, gib)
            if session.async_summary is not None:
                summary["metric"].update(dlio_schema.async_metric_fields(session.async_summary))
            write_json(os.path.join(folder, dlio_schema.SUMMARY_FILE), summary)
