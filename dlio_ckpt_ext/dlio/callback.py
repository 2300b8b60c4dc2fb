"""Hydra callback named by our workload presets; runs on every rank before
DLIO's task function (after DLIO initialised MPI)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dlio_ckpt_ext.dlio import context
from dlio_ckpt_ext.dlio.provenance import dlio_has_checkpoint_workflow, dlio_is_mlcommons_fork
from dlio_ckpt_ext.redact import redact_text

#: files that mark a directory as another run's results
RESULT_FILES = ("summary.json", "ckpt_ext_summary.json")


def wants_checkpoint_only(workload: DictConfig) -> bool:
    wf = workload.get("workflow", {}) or {}
    return bool(wf.get("checkpoint", False)) and not bool(wf.get("train", False))


_DLIO_BENCHMARK: dict[str, type] = {}


def _set_benchmark_class(cls: type) -> None:
    """Make DLIO's task function build `cls` instead of DLIOBenchmark.

    DLIO has no hook for a workflow, but its task function looks
    DLIOBenchmark up in its module at call time, so the swap reaches it
    whether DLIO runs as the dlio_benchmark script or as `python -m`.
    """
    import dlio_benchmark.main as dlio_main
    _DLIO_BENCHMARK.setdefault("original", dlio_main.DLIOBenchmark)
    for module in (dlio_main, sys.modules.get("__main__")):
        if module is not None and hasattr(module, "run_benchmark") and hasattr(module, "DLIOBenchmark"):
            module.DLIOBenchmark = cls


def install_workflow() -> None:
    from dlio_ckpt_ext.dlio.workflow import CheckpointOnlyBenchmark
    _set_benchmark_class(CheckpointOnlyBenchmark)


def choose_workflow(workload: DictConfig) -> None:
    """Our checkpoint-only workflow on a DLIO without one (2.0.0); DLIO's own
    everywhere else (upstream main, and training workloads). Chosen anew for
    each job of a multirun, which may have replaced it for a failed job."""
    if wants_checkpoint_only(workload) and not dlio_has_checkpoint_workflow():
        install_workflow()
    elif "original" in _DLIO_BENCHMARK:
        _set_benchmark_class(_DLIO_BENCHMARK["original"])


class InvalidJob(Exception):
    """A multirun job whose config was refused: the job fails, the sweep goes on."""


def _fail_this_job(message: str) -> None:
    """In a multirun, refusing a job must not end the sweep (hydra stops on
    SystemExit from a callback, but records an exception from the task as a
    failed job and runs the next): DLIO's task function builds this instead."""
    class RefusedJob:
        def __init__(self, cfg: DictConfig) -> None:
            raise InvalidJob(message)

    _set_benchmark_class(RefusedJob)


def reset_singletons() -> None:
    """A hydra multirun runs its jobs one after another in one process: each job
    must start from fresh DLIO arguments and a fresh mechanism, not inherit the
    previous job's (DLIO would, e.g., reuse its output folder)."""
    from dlio_benchmark.utils.config import ConfigArguments

    from dlio_ckpt_ext.dlio.mechanism import StreamingCheckpointing
    ConfigArguments.reset()
    StreamingCheckpointing.reset()


class _Refused(Exception):
    pass


def _stop(comm, message: str) -> None:
    """Every rank checks the same config, so every rank stops here together
    (a multirun job fails alone: see CheckpointWorkloadCallback)."""
    if comm.rank == 0:
        sys.stderr.write(f"[ERROR] {redact_text(message)}\n")
    raise _Refused(redact_text(message))


def redact_hydra_records() -> None:
    """hydra saved this job's config and overrides (.hydra/*.yaml, and a
    sweep's multirun.yaml) before any callback ran; a credential given as an
    override is in them. Rewrite them with credentials redacted."""
    hydra_cfg = HydraConfig.instance().cfg
    if hydra_cfg is None:
        return
    h = hydra_cfg.hydra
    paths = []
    if h.output_subdir is not None:
        saved = os.path.join(h.runtime.output_dir, h.output_subdir)
        paths += [os.path.join(saved, n) for n in ("config.yaml", "overrides.yaml", "hydra.yaml")]
    if OmegaConf.select(hydra_cfg, "hydra.sweep.dir"):
        paths.append(os.path.join(h.sweep.dir, "multirun.yaml"))
    for path in paths:
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError:
            continue
        clean = redact_text(text)
        if clean != text:
            with open(path, "w") as fh:
                fh.write(clean)


def check_workload(workload: DictConfig) -> None:
    """Refuse a bad config before DLIO acts on it: our sections, and a mechanism
    class that is not ours (DLIO would silently fall back to its built-in one)."""
    import importlib

    from dlio_benchmark.utils.utility import DLIOMPI

    from dlio_ckpt_ext.config import MECHANISM_CLASS, load_config
    from dlio_ckpt_ext.dlio.mechanism import StreamingCheckpointing
    from dlio_ckpt_ext.dlio.mpi import topology
    from dlio_ckpt_ext.dlio.sections import check_sections
    from dlio_ckpt_ext.checkpoint.memory import check_memory
    from dlio_ckpt_ext.errors import ConfigError
    comm = DLIOMPI.get_instance().comm()
    try:
        check_sections(workload)
        cfg = load_config(workload, comm.size)
        if cfg.storage.storage_type == "direct_fs" and not dlio_is_mlcommons_fork():
            raise ConfigError("workload.storage.storage_type", "direct_fs",
                              "local_fs (O_DIRECT reads and writes by default), parallel_fs or s3: direct_fs "
                              "is MLCommons' DLIO fork's storage type, and this DLIO has none")
        check_memory(cfg, topology(comm).ranks_per_node, comm.size)
        check_dataset(workload, cfg.storage.storage_type)
        name = str(OmegaConf.select(workload, "checkpoint.checkpoint_mechanism_classname") or "")
        module, _, cls = name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), cls) if module else None
        except (ImportError, AttributeError):
            found = None
        if not (isinstance(found, type) and issubclass(found, StreamingCheckpointing)):
            raise ConfigError("workload.checkpoint.checkpoint_mechanism_classname", name,
                              f"{MECHANISM_CLASS} or a subclass (DLIO would otherwise fall back to its "
                              "built-in mechanism)")
    except ConfigError as exc:
        _stop(comm, str(exc))


#: what DLIO's data loader of each framework imports (neither is this package's dependency)
FRAMEWORK_MODULES = {"pytorch": "torch", "tensorflow": "tensorflow"}


def check_dataset(workload: DictConfig, storage_type: str) -> None:
    """What DLIO's data side needs where a workflow trains or generates data
    (a checkpoint-only run touches no dataset)."""
    from dlio_ckpt_ext.config import workload_trains
    from dlio_ckpt_ext.errors import ConfigError
    trains = workload_trains(workload)
    if not (trains or (workload.get("workflow") or {}).get("generate_data")):
        return
    folder = str(OmegaConf.select(workload, "dataset.data_folder") or "")
    if storage_type == "s3" and not folder.startswith("/"):
        raise ConfigError("workload.dataset.data_folder", folder or None,
                          "an absolute path on a file system with storage_type s3 (the checkpoints go to "
                          "storage_root): DLIO's data generators and readers open dataset files with local file "
                          "APIs (np.savez, np.load, h5py, PIL, tf.data), so its dataset cannot live in the object store")
    framework = str(workload.get("framework", "") or "")
    if trains and framework in FRAMEWORK_MODULES \
            and importlib.util.find_spec(FRAMEWORK_MODULES[framework]) is None:
        there = [f for f, m in FRAMEWORK_MODULES.items() if importlib.util.find_spec(m) is not None]
        instead = " or ".join(f"{f} (with ++workload.reader.data_loader={f})" for f in there) or \
            "a framework whose module is installed (neither torch nor tensorflow is)"
        raise ConfigError("workload.framework", framework,
                          f"{instead} in this environment: DLIO's {framework} data loader needs "
                          f"{FRAMEWORK_MODULES[framework]}, which this package does not install; or install it")


def _used(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, f)) for f in RESULT_FILES)


def agree_output_folder(workload: DictConfig) -> None:
    """One results directory per run, the same on every rank, never one that
    holds another run's results.

    The default is hydra's run directory, whose name has a per-rank timestamp
    and the job id (presets: ${ckpt_ext_job:}); every rank takes rank 0's, so
    DLIO's per-rank files and ours land together, and drops its own if empty.
    An explicit output.folder that already holds results is refused before
    DLIO touches it.
    """
    from dlio_benchmark.utils.utility import DLIOMPI
    comm = DLIOMPI.get_instance().comm()
    explicit = OmegaConf.select(workload, "output.folder")
    if explicit:
        not_a_dir = comm.bcast(os.path.exists(explicit) and not os.path.isdir(explicit) if comm.rank == 0
                               else None, root=0)
        if not_a_dir:
            _stop(comm, f"invalid config: workload.output.folder={explicit!r}; allowed: a directory, or a path "
                        "where one can be created (this is an existing file)")
        refused = comm.bcast(_used(explicit) if comm.rank == 0 else None, root=0)
        if refused:
            _stop(comm, f"invalid config: workload.output.folder={explicit!r}; allowed: a directory that holds "
                        f"no other run's results (it has {' or '.join(RESULT_FILES)}); choose a new folder")
        return
    hydra_cfg = HydraConfig.instance().cfg
    if hydra_cfg is None:
        return
    mine = os.path.abspath(hydra_cfg.hydra.runtime.output_dir)
    chosen = mine
    if comm.rank == 0:
        n = 1
        while _used(chosen):  # a second run in the same second with the same job id
            chosen = f"{mine}-{n}"
            n += 1
        os.makedirs(chosen, exist_ok=True)
    chosen = comm.bcast(chosen, root=0)
    with read_write(hydra_cfg.hydra.runtime), open_dict(hydra_cfg.hydra.runtime):
        hydra_cfg.hydra.runtime.output_dir = chosen
    if mine != chosen and os.path.isdir(mine) and set(os.listdir(mine)) <= {".hydra"}:
        shutil.rmtree(mine, ignore_errors=True)


def _multirun() -> bool:
    from hydra.types import RunMode
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


class CheckpointWorkloadCallback(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Our set-up of the job; one that fails ends every rank, saying why. Hydra turns a
        callback's exception into a warning and runs the job anyway, half set up: a training
        run then counted no step, and on S3 one hung until killed."""
        try:
            self._start_job(config)
        except Exception as exc:  # noqa: BLE001 - any failure here is said, never left to hydra
            from mpi4py import MPI  # DLIO's own communicator may be what failed to start

            from dlio_ckpt_ext.dlio.mpi import abort
            abort(MPI.COMM_WORLD, "the checkpoint workload's set-up failed (dlio_ckpt_ext's hydra "
                  f"callback): {type(exc).__name__}: {exc}", exc)

    def _start_job(self, config: DictConfig) -> None:
        from dlio_ckpt_ext.dlio import storage
        workload = config.workload
        context.set_workload(workload)
        redact_hydra_records()
        reset_singletons()
        try:
            check_workload(workload)
            agree_output_folder(workload)
        except _Refused as exc:
            if not _multirun():
                raise SystemExit(2) from None
            _fail_this_job(str(exc))
            return
        storage.install()
        from dlio_ckpt_ext.config import workload_trains
        if workload_trains(workload):
            from dlio_ckpt_ext.dlio import training
            training.reset()
            training.install()
        choose_workflow(workload)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A failed sweep job says so, and leaves the reason in its directory for
        dlio-ckpt-report sweep; hydra goes on with the next job."""
        from hydra.core.utils import JobStatus
        if not _multirun() or job_return.status != JobStatus.FAILED:
            return
        from dlio_benchmark.utils.utility import DLIOMPI

        from dlio_ckpt_ext.result_files import FAILED_FILE
        reason = redact_text(str(job_return._return_value))
        if DLIOMPI.get_instance().comm().rank == 0:
            job_dir = HydraConfig.get().runtime.output_dir
            with open(os.path.join(job_dir, FAILED_FILE), "w") as fh:
                fh.write(reason + "\n")
            sys.stderr.write(f"[ERROR] sweep job {HydraConfig.get().job.num} "
                             f"({' '.join(redact_text(o) for o in HydraConfig.get().overrides.task)}) failed: "
                             f"{reason}; going on with the next job\n")
