"""One run of the streaming checkpoint workload, as the mechanism sees it.

Either DLIO's checkpoint loop (upstream main's own, or ours on DLIO 2.0.0)
calls save/load once per checkpoint and finalize once; everything else this
package promises happens here, so it is the same on both DLIOs: the storage
probe before any I/O, per-rank timing, the global windows (gathered only in
finalize, so no collective call lands inside DLIO's timed windows), the
inventory, RESULTS, our result files and the keep_files cleanup.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from omegaconf import DictConfig

from dlio_ckpt_ext.checkpoint.background import BackgroundPersist
from dlio_ckpt_ext.checkpoint.local_tier import LocalTier
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer, inventory_error
from dlio_ckpt_ext.config import CheckpointId, RunConfig, load_config
from dlio_ckpt_ext.dlio import interrupts, mpi, ownership, progress, records, schedules, tiers, trace, training
from dlio_ckpt_ext.engine.profile import GiB
from dlio_ckpt_ext.results import async_saves, lines as results_lines, phases, run_warnings, windows
from dlio_ckpt_ext.results import recovery as recovery_block, tiers as tiers_block, training as training_block
from dlio_ckpt_ext.dlio.mpi import (SharingGroups, Topology, abort, launcher_stream, sharing_groups, topology,
                                   user_terminal)
from dlio_ckpt_ext.dlio.ownership import Lease
from dlio_ckpt_ext.dlio.stalls import StallWatch
from dlio_ckpt_ext.engine.profile import (FileStats, phase_report, phase_totals, process_usage, slow_requests,
                                          usage_since)
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.storage import retries
from dlio_ckpt_ext.storage.libraries import requests
from dlio_ckpt_ext.checkpoint.memory import check_memory

PHASES = ("save", "load")
class CheckpointSession:
    def __init__(self, workload: DictConfig, comm, output_folder: str, dlio_reports_metrics: bool,
                 dlio_rank_sync: Optional[bool] = None) -> None:
        """dlio_reports_metrics: DLIO itself prints the [METRIC] lines (upstream),
        so ours would only repeat them under another label. dlio_rank_sync: the
        rank_sync DLIO's own loop applies, where it differs from ours (upstream's
        default is False when a workload does not set it)."""
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.workload = workload
        self.dlio_reports_metrics = dlio_reports_metrics
        try:
            self.config: RunConfig = load_config(workload, self.size)
        except ConfigError as exc:
            # Every rank validates the same config, so every rank stops here
            # together: a clean exit, no abort needed.
            if self.rank == 0:
                sys.stderr.write(f"[ERROR] {exc}\n")  # ConfigError redacts credentials itself
            raise SystemExit(2) from None
        self.rank_sync = self.config.checkpoint.rank_sync if dlio_rank_sync is None else dlio_rank_sync
        # DLIO's per-rank run directories can differ (hydra's ${now}): ours is rank 0's
        self.output_folder = comm.bcast(os.path.abspath(output_folder) if self.rank == 0 else None, root=0)
        #: per phase: this rank's record of each checkpoint, in the order run
        self.local: dict[str, list[dict]] = {p: [] for p in PHASES}
        self.files: dict[str, list[FileStats]] = {p: [] for p in PHASES}
        #: rank 0 only, after finalize: the global window of each checkpoint
        self.windows: dict[str, list[dict]] = {p: [] for p in PHASES}
        self.inventory: Optional[dict] = None
        #: rank 0 after finalize, when the run loaded: what the loads read (Layout.summary)
        self.restore: Optional[dict] = None
        #: async mode: this rank's blocked part of each save; rank 0 after finalize: the summary
        self.blocked: list[dict] = []
        self.async_summary: Optional[dict] = None
        self.drain_s = 0.0
        #: per rank whose CPU share set its save figure, the checkpoint steps where it did
        self.starved_steps: dict[int, list[int]] = {}
        #: per phase, rank 0's sum of every rank's CPU in the windows (phases.client_cpu)
        self.client_cpu: dict[str, dict] = {}
        self.persister: Optional[BackgroundPersist] = None
        #: tiers: this rank's local tier, its record of each local save, and the
        #: priority its persists ran at; rank 0 after finalize: the local windows and TIERS
        self.tier: Optional[LocalTier] = None
        self.tier_records: list[dict] = []
        self.tier_windows: list[dict] = []
        self.tiers_summary: Optional[dict] = None
        self.persist_priority: dict = {}
        self.tier_note: Optional[str] = None
        #: recoveries: this rank's record of each (schedules/recovery.py); rank 0 after finalize: RECOVERY
        self.recoveries: list[dict] = []
        self.recovery_summary: Optional[list[dict]] = None
        #: rank 0: each universal conversion a load needed, summed over the ranks (schedules/conversion.py)
        self.conversions: list[dict] = []
        #: share=broadcast: the groups of ranks reading the same ranges
        self.sharing: Optional[SharingGroups] = None
        #: the step persisting in the background (async mode)
        self.persisting_step = 0
        #: the saves DLIO's loop asked for; the checkpoints they put on the storage under
        #: test (every one, or with tiers every persistent_every-th), in order
        self.saves_made = 0
        self.saved: list[CheckpointId] = []
        #: a training run: each saved checkpoint's training iteration
        self.iterations: dict[CheckpointId, int] = {}
        #: a training run: each save call as the loop saw it; rank 0 after finalize: TRAINING
        self.training_saves: list[dict] = []
        self.training_summary: Optional[dict] = None
        #: what abort_on_error is guarding now (None: between our operations)
        self.doing: Optional[str] = None
        # reentrant: the main thread's signal handler may run while that thread holds it
        self._interrupt_said, self._interrupt_lock = False, threading.RLock()
        self.start_time = time.time()
        self.end_time = self.start_time
        #: rank 0: this run's claim on its folders (dlio/ownership.py)
        self.lease: Optional[Lease] = None
        #: every rank: the run's id and the folders it claimed, released by whichever rank fails
        self.claims: tuple = (None,)
        mpi.ON_ABORT[:] = [lambda: ownership.release_claims(self)]
        interrupts.catch_interrupts()
        # where an interrupt is said, found now: after SIGTERM mpirun forwards nothing and
        # exits within about half a second, and then its /proc entries are gone with it
        self._interrupt_stream = launcher_stream() if user_terminal() is None else None
        with self.abort_on_error("preparing the checkpoint storage"):
            self.topology: Topology = topology(comm)
            self.rank_buffer_bytes = check_memory(self.config, self.topology.ranks_per_node, self.size)
            self.checkpointer = Checkpointer(self.config, self.rank, self.size, self.topology.ranks_per_node,
                                             self.topology.cpu_share)
            self.checkpointer.tracer = trace.chunk_tracer(self.rank)
            self.checkpointer.backend.start_retry_counting()
            ownership.claim_folders(self, "output")
            self.checkpointer.prepare()
            self.sharing = sharing_groups(self.checkpointer, self.config, comm)
        if self.config.has_tiers:
            tiers.open_for(self)
        self.stall_watch = StallWatch(self.rank, self.config.streaming.stall_warning_s, lambda: progress.stalled_where(self),
                                      progress.say_now)
        #: rank 0 after finalize: every rank's stalls
        self.stalls: list[dict] = []
        if self.config.is_async:
            self.persister = BackgroundPersist(lambda exc: abort(self.comm, f"checkpoint persist failed: {exc}", exc))
            # the background thread's own communicator for DCP's commit, as DCP
            # gives async_save a process group of its own
            self.persist_comm = comm.Dup()
        interrupts.set_active(self)
        self._probe()
        with self.abort_on_error("claiming the checkpoint folder"):
            ownership.claim_folders(self, "checkpoint")
        c = self.config.checkpoint
        if c.num_checkpoints_write == 0 and not self.config.trains and not self.config.recovers:
            # Reading an earlier run's checkpoints: check they are all there first.
            self._check_inventory([(s, 1) for s in self.config.steps_read()])
        if self.rank == 0:
            with self.abort_on_error("writing the run's marker"):
                records.write_running(self)
            self._announce()

    def _refuse_together(self, refusal: Optional[str], gathered: bool = True) -> None:
        """Every rank stops cleanly when one refused (gathered: any rank may
        have; else rank 0 decided for all): rank 0 says the first refusal."""
        if gathered:
            refusal = next((r for r in self.comm.gather(refusal, root=0) or [] if r), None)
        refusal = self.comm.bcast(refusal, root=0)
        if refusal:
            if self.rank == 0:
                sys.stderr.write(f"[ERROR] {refusal}\n")
                sys.stderr.flush()
                ownership.release_claims(self)
            raise SystemExit(2)

    # -- failures end every rank ---------------------------------------------
    @contextlib.contextmanager
    def abort_on_error(self, what: str):
        self.doing, outer = what, self.doing
        try:
            yield
        except interrupts.Interrupted as exc:
            # mpirun is ending every rank already: this one has aborted its open
            # upload or removed its partial file on the way here, and just goes.
            self._say_interrupted(self._interrupted(what, exc.signum))
            if self.persister is not None:
                self.persister.cancel()
            raise SystemExit(128 + exc.signum) from None
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure must end every rank
            abort(self.comm, f"{what} failed: {exc}", exc)
        finally:
            self.doing = outer

    def _say_interrupted(self, what: str) -> None:
        with self._interrupt_lock:
            if self._interrupt_said:
                return
            self._interrupt_said = True
        done = [f"{phase} {r['step']}" for phase in PHASES for r in self.local[phase]]
        line = (f"[ERROR] rank {self.rank}: {what}"
                + (f" (finished before it: {', '.join(done[-6:])})" if done else ""))
        # after a Ctrl-C or SIGTERM mpirun forwards no more output (measured: none
        # of these lines came through): its terminal, or its piped stderr, is told directly
        if self._interrupt_stream is None:
            progress.say_now(line)
            return
        with contextlib.suppress(OSError):
            self._interrupt_stream.write(line + "\n")
            self._interrupt_stream.flush()

    def interrupted_in_background(self, signum: int) -> None:
        """The watch thread, the moment SIGINT or SIGTERM arrives (Ctrl-C on
        mpirun, or mpirun ending the job because a rank or host was lost),
        whatever the main thread is blocked in, and said at once (mpirun's
        SIGKILL follows within a second). A persist running in the background
        is cancelled here, a save or load of the main thread stops when that
        thread is back in Python: either writer aborts its upload or removes
        its partial file, and the upload watch finishes an abort that SIGKILL
        cut short."""
        self.say_signal(signum)
        if self.persister is not None and self.persister.busy:
            self.persister.cancel()

    def say_signal(self, signum: int) -> None:
        """What SIGINT or SIGTERM stopped, said once, whichever thread gets there first."""
        busy = self.persister is not None and self.persister.busy
        if busy or self.doing is not None:
            self._say_interrupted(self._interrupted(self.doing, signum))
        else:
            self._say_interrupted(f"interrupted by {signal.Signals(signum).name} between checkpoints; no "
                                  "checkpoint file was open")

    def _interrupted(self, what: Optional[str], signum: int) -> str:
        """What an interrupt stopped: the checkpoint persisting in the
        background if there is one (what becomes of it is what matters),
        else `what` the main thread was doing."""
        if self.persister is not None and self.persister.busy:
            what = f"checkpoint persist {self.persisting_step}"
        return f"{what} interrupted by {signal.Signals(signum).name}; its partial file or open upload was removed"

    def _probe(self) -> None:
        if self.rank == 0:
            with self.abort_on_error("checking the storage"):
                self.checkpointer.backend.probe()
        self.comm.barrier()

    def _announce(self) -> None:
        ck = self.checkpointer
        total = ck.checkpoint_bytes()
        print(f"[INFO] streaming checkpoint: model {self.config.model.name}, {self.size} ranks on "
              f"{self.topology.num_hosts} host(s), {total} bytes ({total / GiB:.2f} GiB) per checkpoint "
              f"to {ck.backend.uri('').rstrip('/')}", flush=True)
        for line in self.warnings() + ([self.tier_note] if self.tier_note else []):
            print(line, flush=True)

    def tier_settings(self) -> dict:
        return tiers_block.settings(self)

    def warnings(self) -> list[str]:
        """What a reader of the figures must know about how they were measured."""
        return run_warnings.warnings(self)

    # -- the checkpoints -------------------------------------------------------
    @property
    def checkpoint_bytes(self) -> int:
        return self.checkpointer.checkpoint_bytes()

    def save(self, epoch: int, step: int) -> list[FileStats]:
        """One checkpoint DLIO's loop asks for. In a training run the loop
        decides which and names it; every save's call is timed (the loop's stall)."""
        self.saves_made += 1
        iteration = step
        if self.config.trains:
            steps = training.loop().steps
            step, epoch = training.checkpoint_id(self.config.layout, epoch, step, steps)
            iteration = steps or step
            self.iterations[(step, epoch)] = iteration
        persistent = self.tier is None or self.saves_made % self.config.tiers.persistent_every == 0
        start = time.time()
        files = schedules.save(self, epoch, step, iteration, persistent)
        end = time.time()
        if persistent:
            self.saved.append((step, epoch))
        if not self.config.is_async:  # an async save's I/O is its persist's
            training.io_windows().closed.append((start, end))
        if self.config.trains:
            self.training_saves.append({"step": step, "epoch": epoch, "iteration": iteration, "start": start, "end": end,
                                        **training.loop().saved(end)})
        return files

    def label(self, step: int, epoch: int) -> int:
        """The number a checkpoint goes by in lines and records: its step, or in a
        training run its training iteration (DLIO's step restarts every epoch)."""
        return self.iterations.get((step, epoch), step)

    def load(self, epoch: int, step: int) -> list[FileStats]:
        return schedules.load(self, epoch, step)

    def drain(self) -> None:
        """Async mode: wait for the last checkpoint to be persisted (before it is
        listed, read or reported); its wait is recorded, not charged to a save."""
        if self.persister is not None and self.persister.busy:
            with self.abort_on_error("persisting the last checkpoint"):
                self.drain_s += self.persister.wait()[1]

    def _checkpoint(self, phase: str, epoch: int, step: int,
                    action: Callable[..., list[FileStats]]) -> list[FileStats]:
        label = self.label(step, epoch)
        with self.abort_on_error(f"checkpoint {phase} {label}"), progress.progress(self, phase, label) as bar, \
                progress.span(self, phase, label):
            start, usage, counted = time.time(), process_usage(), self.client_counts()
            self.stall_watch.begin(phase, label)
            try:
                files = action(step, epoch, progress.ticking(self, bar))
            finally:
                self.stall_watch.end()
            end = time.time()
            usage = usage_since(usage)
        record = windows.local_record(label, files, start, end, usage, *self.client_since(counted))
        if phase == "load" and self.sharing is not None:
            record.update(self.checkpointer.last_broadcast)
        self.local[phase].append(record)
        self.files[phase].extend(files)
        self._keep_window(phase, record)
        return files

    def client_counts(self) -> tuple[Optional[dict], Optional[dict]]:
        """This rank's client's tallies now: throttles and retries, requests by kind (None: not counted)."""
        backend = self.checkpointer.backend
        return backend.retry_counts(), backend.request_counts()

    def client_since(self, before: tuple[Optional[dict], Optional[dict]]) -> tuple[Optional[dict], Optional[dict]]:
        """What this rank's client counted since `before` (client_counts): retries, requests by kind."""
        now = self.client_counts()
        return retries.since(before[0], now[0]), requests.since(before[1], now[1])

    def _keep_window(self, phase: str, record: dict) -> None:
        """With rank_sync (the ranks meet after each checkpoint anyway), rank 0
        gathers the checkpoint's window parts now, says its global window and
        appends it to WINDOWS_FILE: a run that breaks later keeps it. O(1) a rank."""
        if not self.rank_sync:
            return
        with self.abort_on_error(f"gathering checkpoint {phase} {record['step']}'s window"):
            parts = self.comm.gather(windows.window_part(record, self.rank, self.topology.host), root=0)
            if self.rank == 0:
                window = windows.global_window(parts)
                records.append_window(self, phase, window)
                print(f"[INFO] {windows.window_line(phase, window)}", flush=True)
                for line in phases.throttle_warnings(phase, [window]):
                    progress.say_now(line)

    def _barrier(self) -> None:
        """DCP's commit barrier: waiting for the other ranks is no stalled request."""
        self.stall_watch.end()
        try:
            self.comm.barrier()
        finally:
            self.stall_watch.resume()

    def _check_inventory(self, checkpoints: list[CheckpointId], saved: bool = False) -> None:
        """Rank 0 lists once and compares with the plan; nobody else lists."""
        result = None
        if self.rank == 0:
            with self.abort_on_error("listing the checkpoints"):
                result = self.checkpointer.inventory(checkpoints, saved=saved)
            print(f"[INFO] inventory: {result['message']}", flush=True)
        self.inventory = self.comm.bcast(result, root=0)
        if not self.inventory["ok"] and self.rank == 0:
            abort(self.comm, str(inventory_error(self.inventory)))

    # -- the end -----------------------------------------------------------------
    def finalize(self) -> None:
        """Collective: gather the windows, check the inventory, write the results,
        then clean up. Called once, after the last checkpoint, on every rank."""
        self.drain()
        c = self.config.checkpoint
        if self.config.trains:
            training_block.summarise(self)
            if c.num_checkpoints_read:
                training_block.read_after(self)
        self.end_time = time.time()
        if self.persister is not None:
            blocked = self.comm.gather(self.blocked, root=0)
            self.persist_comm.Free()
        for phase in PHASES:
            replica = self.rank // (self.config.parallelism.tensor * self.config.parallelism.pipeline) \
                if self.config.is_model_load and phase == "load" else None
            gathered = self.comm.gather([windows.window_part(r, self.rank, self.topology.host, replica)
                                         for r in self.local[phase]], root=0)
            if self.rank == 0:
                self.windows[phase] = [windows.global_window([g[i] for g in gathered])
                                       for i in range(len(self.local[phase]))]
        if self.persister is not None and self.rank == 0:
            self.async_summary = async_saves.async_checkpoints(blocked, self.windows["save"], self.drain_s)
        if self.tier is not None:
            gathered = self.comm.gather([windows.window_part(r, self.rank, self.topology.host)
                                         for r in self.tier_records], root=0)
            if self.rank == 0:
                self.tier_windows = [windows.global_window([g[i] for g in gathered])
                                     for i in range(len(self.tier_records))]
                self.tiers_summary = tiers_block.tiers_summary(
                    self.tier_windows, self.windows["save"], self.config.persistent_interval_s, self.size,
                    self.async_summary["per_checkpoint"])
        if self.config.recovers:
            gathered = self.comm.gather(self.recoveries, root=0)
            if self.rank == 0:
                self.recovery_summary = recovery_block.summarise(gathered)
        if self.saved_checkpoints():
            self._check_inventory(self.saved_checkpoints(), saved=True)
        with self.abort_on_error("writing the results"):
            self._write_results()
        self.comm.barrier()
        if not c.keep_files:
            steps = self.saved_checkpoints()
            with self.abort_on_error("removing the checkpoints"):
                local = self.tier.remove_all() if self.tier is not None else 0
                removed = self.comm.reduce(self.checkpointer.remove_written(steps) + local, root=0)
            self.comm.barrier()
            if self.rank == 0:
                with self.abort_on_error("removing the checkpoint directories"):
                    self.checkpointer.remove_empty_dirs(steps)
                print(f"[INFO] keep_files=False: removed the {removed} checkpoint files this run wrote", flush=True)
        if self.rank == 0:
            records.remove_running(self)
            if self.lease is not None:
                self.lease.release()
        if self.sharing is not None:
            self.sharing.free()
        self.checkpointer.close()
        if self.tier is not None:
            self.tier.close()
        self.comm.barrier()

    def saved_checkpoints(self) -> list[CheckpointId]:
        """The checkpoints this run put on the storage under test: planned, or in a
        training run the ones DLIO's loop asked for."""
        return self.saved if self.config.trains else self.config.checkpoints_saved()

    def _write_results(self) -> None:
        totals = {p: phase_totals(self.files[p]) for p in PHASES}
        records.write_rank_stats(self, totals)
        gathered = self.comm.gather(totals, root=0)
        stalls = self.comm.gather(self.stall_watch.stalls, root=0)
        # an upload's close waits for its parts in flight: a held part shows there
        lent = self.checkpointer.backend.lends_write_memory
        slow = self.comm.gather({p: slow_requests(self.files[p], closes=lent and p == "save") for p in PHASES},
                                root=0)
        # said only where a binding narrowed the rank's CPUs: unbound, the node's
        # size is the limit, and RESULTS' bottleneck line says so already
        bound = self.topology.binding != "none"
        steps = self.comm.gather(self.checkpointer.threads.generation_limited_steps if bound else [], root=0)
        if self.rank != 0:
            return
        self.starved_steps = {r: s for r, s in enumerate(steps) if s}
        self.stalls = [{**s, "rank": r} for r, rank_stalls in enumerate(stalls) for s in rank_stalls]
        reports = {p: phase_report([g[p] for g in gathered]) for p in PHASES}
        for phase in PHASES:
            if reports[phase]:
                reports[phase]["client_cpu"] = self.client_cpu[phase] = \
                    phases.client_cpu(self.windows[phase], self.topology.node_cpus)
                reports[phase]["slow_requests"] = phases.slow_requests([s[phase] for s in slow])
        print("\n".join(results_lines.lines(self, reports)), flush=True)
        print("\n".join(records.write_run_record(self, reports)), flush=True)
        print(f"[INFO] results in {self.output_folder}", flush=True)
