"""dlio-ckpt-report goodput: a finished run's record through the goodput model
(dlio_ckpt_ext/goodput.py; docs/goodput.md), with the failure model and scales
given on the command line."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from dlio_ckpt_ext import goodput
from dlio_ckpt_ext.report.results import ResultsError
from dlio_ckpt_ext.results.goodput import goodput_lines


def goodput_report(summary: dict, nodes: list[int], failures_per_node_day: float, restart_s: float,
                   interval_s: Optional[float] = None, local_share: Optional[float] = None,
                   out: Optional[str] = None) -> list[str]:
    """The GOODPUT block for these settings; with `out`, its chart drawn there too."""
    g = goodput.scales(summary, nodes, failures_per_node_day, restart_s, interval_s, local_share)
    if g is None:
        raise ResultsError("the run says no interval between checkpoints (no tiers.interval_s, training loop or "
                           "checkpoint.time_between_checkpoints): give --interval-s")
    lines = goodput_lines(g)
    if out:
        from dlio_ckpt_ext.report.goodput_chart import goodput_chart
        lines.append(f"chart: {goodput_chart(g, Path(out))}")
    return lines
