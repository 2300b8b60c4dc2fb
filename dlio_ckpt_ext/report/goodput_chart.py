"""Goodput as a chart (dlio-ckpt-report goodput --out, and the run's picture):
goodput against the checkpoint interval, a curve a scale (and, for a tiered
run, a local share), the run's interval and the best one marked on each, the
intervals past which the first-order model no longer holds shaded in the
curve's colour; the best interval is Daly's for the stall a cycle costs
(the GOODPUT block's), which with tiers or a restart time may lie a little off
the curve's own top; beside it, the badput at the run's interval as a stacked bar a
scale. Every point is goodput.badput's for the row's own tiers and MTBF
(goodput.scales' rows)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dlio_ckpt_ext import goodput  # noqa: E402

#: the badput categories stacked, bottom first, with their colours
BADPUT = (("save_stall", "save stall", "tab:blue"), ("restart", "restart", "tab:gray"),
          ("restore", "restore", "tab:green"), ("lost_work", "lost work", "tab:red"))
#: the intervals a curve spans: a decade each side of the run's and the best interval
SPAN = 10.0


def row_label(row: dict) -> str:
    share = "" if row["local_share"] is None else f", local share {row['local_share']:g}"
    return f"{row['nodes']} node{'s' if row['nodes'] != 1 else ''}{share}"


def curve(g: dict, row: dict, points: int = 80) -> dict:
    """A row's goodput at `points` intervals spaced evenly on a log scale, and the first
    interval past which the first-order model no longer holds (None: it holds throughout)."""
    tiers = [goodput.Tier(**t) for t in row["tiers"]]
    mtbf = row["at_interval"]["mtbf_s"]
    ends = (row["at_best"]["interval_s"], row["at_interval"]["interval_s"])
    lo, hi = math.log10(min(ends) / SPAN), math.log10(max(ends) * SPAN)
    xs = [10 ** (lo + (hi - lo) * i / (points - 1)) for i in range(points)]
    at = [goodput.badput(x, tiers, mtbf, g["restart_s"]) for x in xs]
    beyond = next((x for x, b in zip(xs, at) if not b["first_order_holds"]), None)
    return {"intervals": xs, "goodput": [b["goodput"] for b in at], "beyond": beyond}


def draw_goodput(g: dict, curves_ax, bars_ax) -> None:
    """The curves on one axes, the badput bars on the other."""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, row in enumerate(g["rows"]):
        colour = colours[i % len(colours)]
        c = curve(g, row)
        curves_ax.plot(c["intervals"], [100 * y for y in c["goodput"]], color=colour, label=row_label(row))
        run, top = row["at_interval"], row["at_best"]
        curves_ax.plot([run["interval_s"]], [100 * run["goodput"]], "o", color=colour)
        curves_ax.plot([top["interval_s"]], [100 * top["goodput"]], "*", color=colour, markersize=11)
        if c["beyond"] is not None:
            curves_ax.axvspan(c["beyond"], c["intervals"][-1], color=colour, alpha=0.08, lw=0)
    curves_ax.set_xscale("log")
    curves_ax.set_xlabel("seconds between checkpoints (log)")
    curves_ax.set_ylabel("goodput (% of the job's time)")
    curves_ax.set_title(f"goodput against the interval (o: this run's, {g['interval_s']:g} s; *: Daly's, the "
                        "block's best); shaded: beyond the model's first order", fontsize=9)
    curves_ax.legend(fontsize=8)
    labels = [row_label(r) for r in g["rows"]]
    bottom = [0.0] * len(labels)
    for key, name, colour in BADPUT:
        heights = [100 * r["at_interval"][key] for r in g["rows"]]
        bars_ax.bar(range(len(labels)), heights, bottom=bottom, color=colour, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    bars_ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    bars_ax.set_ylabel("badput (% of the job's time)")
    bars_ax.set_title(f"badput at this run's interval ({g['interval_s']:g} s)", fontsize=9)
    bars_ax.legend(fontsize=8)


def goodput_figure(g: dict):
    fig, (curves_ax, bars_ax) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    draw_goodput(g, curves_ax, bars_ax)
    fig.tight_layout()
    return fig


def goodput_chart(g: dict, out: Path) -> Path:
    fig = goodput_figure(g)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
