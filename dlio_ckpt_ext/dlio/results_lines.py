"""RESULTS, rank 0's block at the end of a run: the windows, the schedules'
blocks (TRAINING, TIERS, async), each phase's figures, the restore, the
generator threads and the warnings."""
from __future__ import annotations

from dlio_ckpt_ext.dlio import metrics, recovery_report, run_warnings, tier_report, training_report

PHASES = ("save", "load")


def lines(self, reports: dict) -> list[str]:
    """The block (`self`: the session, its figures gathered on rank 0)."""
    # where DLIO prints the [METRIC] lines itself, ours would repeat them under another label
    label = "[INFO] global window:" if self.dlio_reports_metrics else "[METRIC]"
    lines = [line for phase in PHASES if self.windows[phase]
             for line in metrics.metric_lines(phase, self.windows[phase], label)]
    if self.training_summary is not None:
        lines += training_report.training_lines(self.training_summary)
    if self.tiers_summary is not None:
        lines += metrics.metric_lines("local save", self.tier_windows)
        lines += metrics.metric_lines("persist", self.windows["save"])
        lines += tier_report.tiers_lines(self.tiers_summary, self.tier_settings())
    elif self.async_summary is not None:
        # the persist windows are the save windows; named apart for async readers
        lines += metrics.metric_lines("persist", self.windows["save"])
        lines += metrics.async_lines(self.async_summary, self.config.checkpoint.time_between_checkpoints)
    backend = self.checkpointer.backend
    concurrency = self.checkpointer.concurrency()
    for phase, method in (("save", backend.write_cache_method), ("load", backend.read_cache_method)):
        lines += metrics.results_block(phase, reports[phase], method, concurrency.get(phase),
                                       self.checkpointer.durability() if phase == "save" else "")
        if reports[phase]:
            lines += metrics.client_cpu_lines(phase, reports[phase]["client_cpu"])
            reports[phase]["retries"] = metrics.phase_retries(self.windows[phase])
            lines += metrics.retry_lines(reports[phase]["retries"])
            lines += metrics.slow_request_lines(reports[phase]["slow_requests"],
                                                reports[phase]["retries"] is not None)
            lines += metrics.skew_lines(phase, self.windows[phase], self.stalls)
    if self.windows["load"]:
        ck = self.checkpointer
        self.restore = ck.layout.summary(self.config.shape, self.config.parallelism, ck.job,
                                         self.config.read_size, self.config.checkpoint.share)
        lines += metrics.restore_lines(self.restore, self.windows["load"])
    if self.recovery_summary:
        lines += recovery_report.recovery_lines(self.recovery_summary)
    budget = self.checkpointer.threads.describe()
    if self.local["save"]:
        how = (f"adaptive: the fewest keeping generation >= {budget['target_margin']:g}x I/O, up to "
               f"{budget['limit']}" if budget["mode"] == "adaptive" else "fixed by streaming.gen_threads")
        lines.append(f"  {'generator threads (rank 0)':28s} {budget['final']} ({how}; per file: "
                     f"{run_warnings.runs(budget['used_per_file'])})")
    return lines + self.warnings()
