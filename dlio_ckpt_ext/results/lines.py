"""RESULTS, rank 0's block at the end of a run: the windows, the schedules'
blocks (TRAINING, TIERS, async), each phase's figures, the restore, the
generator threads and the warnings."""
from __future__ import annotations

from dlio_ckpt_ext.results import async_saves, phases, recovery, restore, run_warnings, tiers, training, windows

PHASES = ("save", "load")


def lines(session, reports: dict) -> list[str]:
    """The block (`session`: the CheckpointSession, its figures gathered on rank 0)."""
    # where DLIO prints the [METRIC] lines itself, ours would repeat them under another label
    label = "[INFO] global window:" if session.dlio_reports_metrics else "[METRIC]"
    lines = [line for phase in PHASES if session.windows[phase]
             for line in windows.metric_lines(phase, session.windows[phase], label)]
    if session.training_summary is not None:
        lines += training.training_lines(session.training_summary)
    if session.tiers_summary is not None:
        lines += windows.metric_lines("local save", session.tier_windows)
        lines += windows.metric_lines("persist", session.windows["save"])
        lines += tiers.tiers_lines(session.tiers_summary, session.tier_settings())
    elif session.async_summary is not None:
        # the persist windows are the save windows; named apart for async readers
        lines += windows.metric_lines("persist", session.windows["save"])
        lines += async_saves.async_lines(session.async_summary, session.config.checkpoint.time_between_checkpoints)
    backend = session.checkpointer.backend
    concurrency = session.checkpointer.concurrency()
    for phase, method in (("save", backend.write_cache_method), ("load", backend.read_cache_method)):
        lines += phases.results_block(phase, reports[phase], method, concurrency.get(phase),
                                       session.checkpointer.durability() if phase == "save" else "")
        if reports[phase]:
            lines += phases.client_cpu_lines(phase, reports[phase]["client_cpu"])
            reports[phase]["retries"] = phases.phase_retries(session.windows[phase])
            lines += phases.retry_lines(reports[phase]["retries"])
            lines += phases.request_lines(session.windows[phase], backend.describe())
            lines += phases.slow_request_lines(reports[phase]["slow_requests"],
                                                reports[phase]["retries"] is not None)
            lines += phases.skew_lines(phase, session.windows[phase], session.stalls)
    if session.windows["load"]:
        ck = session.checkpointer
        session.restore = ck.layout.summary(session.config.shape, session.config.parallelism, ck.job,
                                         session.config.read_size, session.config.checkpoint.share)
        lines += restore.restore_lines(session.restore, session.windows["load"])
    if session.conversions and not session.recovery_summary:  # a recovery's is in its RECOVERY lines
        lines.append("CONVERSION (DeepSpeed's universal checkpoint, made before the load; docs/recovery.md)")
        lines += [recovery.conversion_line(c) for c in session.conversions]
    if session.recovery_summary:
        lines += recovery.recovery_lines(session.recovery_summary)
    budget = session.checkpointer.threads.describe()
    if session.local["save"]:
        how = (f"adaptive: the fewest keeping generation >= {budget['target_margin']:g}x I/O, up to "
               f"{budget['limit']}" if budget["mode"] == "adaptive" else "fixed by streaming.gen_threads")
        lines.append(f"  {'generator threads (rank 0)':28s} {budget['final']} ({how}; per file: "
                     f"{run_warnings.runs(budget['used_per_file'])})")
    return lines + session.warnings()
