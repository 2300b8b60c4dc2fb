"""GOODPUT: the share of the job's time that is useful work at this run's measured
costs, at the scales asked (the model: dlio_ckpt_ext/goodput.py): its summary
for the record, its lines in RESULTS, and its panel, goodput against the
interval a curve a scale (and, for a tiered run, a local share), the run's
interval and the best one marked on each, the intervals past which the
first-order model no longer holds shaded in the curve's colour; the best
interval is Daly's for the stall a cycle costs (the block's), which with tiers
or a restart time may lie a little off the curve's own top; beside it, the
badput at the run's interval as a stacked bar a scale. Every point is
goodput.badput's for the row's own tiers and MTBF (goodput.scales' rows).
Also drawn alone by `dlio-ckpt-report goodput --out` (report/goodput_chart.py)."""
from __future__ import annotations

import math
from typing import Optional

from dlio_ckpt_ext import goodput

KEY = "goodput"


def summarise(record: dict, settings) -> dict | None:
    """The block of a run's record, at the scales and failure rate of its goodput settings
    (config.sections.goodput); None where the run has no interval."""
    return goodput.scales(record, settings.nodes, settings.failures_per_node_day, settings.restart_s,
                          settings.interval_s or None, None if settings.local_share < 0 else settings.local_share)


def goodput_lines(g: Optional[dict]) -> list[str]:
    """The GOODPUT block of `scales`' result."""
    if g is None:
        return ["GOODPUT: the run has no interval between checkpoints (no tiers.interval_s, training loop or "
                "checkpoint.time_between_checkpoints): set workload.goodput.interval_s (dlio-ckpt-report goodput "
                "--interval-s)"]
    pct = lambda v: f"{100 * v:.2f} %"  # noqa: E731
    first, rate = g["tiers"][0], g["failures_per_node_day"]
    lines = ["GOODPUT (dlio_ckpt_ext/goodput.py; docs/goodput.md):",
             f"  failures                     {rate:g} a node and day"
             + (f" ({goodput.FAILURE_SOURCE})" if rate == goodput.LLAMA3_FAILURES_PER_NODE_DAY else ""),
             f"  restart outside storage      {g['restart_s']:g} s" + ("" if g["restart_s"] else " (not given)"),
             f"  this run ({g['kind']})              {g['run_nodes']} node(s): stall {first['stall_s']:.3f} s a "
             f"checkpoint, durable {first['lag_s']:.3f} s after, restore {first['restore_s']:.3f} s; interval "
             f"{g['interval_s']:g} s"]
    if g["kind"] == "tiers":
        p = g["tiers"][1]
        lines.append(f"  {'persistent tier':28s} one save in {p['every']}: stall {p['stall_s']:.3f} s, durable "
                     f"{p['lag_s']:.3f} s after, restore {p['restore_s']:.3f} s")
    lines += [f"  note: {n}" for n in g["notes"]]
    lines.append("  at other scales: the checkpoint's bytes spread over the nodes, each node's bandwidth this "
                 "run's (assumed to scale per node)")
    lines.append(f"  {'nodes':>6} {'local share':>11} {'MTBF':>9} {'interval':>9} {'goodput':>9} {'stall':>8} "
                 f"{'restart':>8} {'restore':>8} {'lost':>8} | {'best':>9} {'goodput':>9}")
    for r in g["rows"]:
        b, top = r["at_interval"], r["at_best"]
        flag = "" if b["first_order_holds"] and top["first_order_holds"] else "  (beyond the model's first order)"
        share = "" if r["local_share"] is None else f"{r['local_share']:g}"
        lines.append(f"  {r['nodes']:>6} {share:>11} {b['mtbf_s'] / 3600:>8.2f}h {b['interval_s']:>8.0f}s "
                     f"{pct(b['goodput']):>9} {pct(b['save_stall']):>8} {pct(b['restart']):>8} "
                     f"{pct(b['restore']):>8} {pct(b['lost_work']):>8} | {top['interval_s']:>8.1f}s "
                     f"{pct(top['goodput']):>9}{flag}")
    return lines


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
    from matplotlib import rcParams  # only where a picture is drawn: not in a run's ranks
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
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
