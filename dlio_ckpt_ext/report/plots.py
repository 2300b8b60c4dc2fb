"""PNG charts for one run and for a sweep (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dlio_ckpt_ext.report.results import Result  # noqa: E402
from dlio_ckpt_ext.results import phases  # noqa: E402
from dlio_ckpt_ext.results.phases import PHASE_COLOURS  # noqa: E402


def run_report(result: Result, out: Path) -> Path:
    fig = run_figure(result)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run_figure(result: Result):
    """Each block's panel from its results/ module: the save and load phases' three
    (results/phases.py), then each block the run has (tiers, recovery, training), and
    where the run has an interval, its goodput against the interval and its badput at
    each scale."""
    from dlio_ckpt_ext.results import panels_of
    g = result.summary.get("goodput")
    blocks = panels_of(result.summary)
    heights = [3, 2, 2] + [2] * len(blocks) + ([3] if g else [])
    fig = plt.figure(figsize=(12, 11 + 3 * len(blocks) + (4 if g else 0)))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, width_ratios=[3, 2])
    phases.panels(result, *(fig.add_subplot(grid[i, :]) for i in range(3)))
    for i, (_, draw) in enumerate(blocks):  # TIERS, RECOVERY, TRAINING (each its results/ module's panel)
        draw(result.summary, fig.add_subplot(grid[3 + i, :]))
    if g:  # the GOODPUT block's panel (results/goodput.py)
        from dlio_ckpt_ext.results.goodput import draw_goodput
        row = 3 + len(blocks)
        draw_goodput(g, fig.add_subplot(grid[row, 0]), fig.add_subplot(grid[row, 1]))
    fig.tight_layout()
    return fig


def sweep_chart(swept: list[str], rows: list[dict], out: Path) -> Path:
    fig = sweep_figure(swept, rows)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def sweep_figure(swept: list[str], rows: list[dict]):
    """Throughput against the swept parameter(s): a line for one numeric
    parameter, bars labelled with every parameter otherwise; beside it, where the
    jobs have a GOODPUT block, their goodput against it the same way."""
    with_goodput = any(r.get("goodput_pct") is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if with_goodput else 1, figsize=(16 if with_goodput else 10, 5), squeeze=False)
    ax = axes[0][0]
    labels = [", ".join(f"{k.split('.')[-1]}={r[k]}" for k in swept) or f"job {r['job']}" for r in rows]
    numeric = len(swept) == 1 and all(_is_number(r[swept[0]]) for r in rows)
    for phase in ("save", "load"):
        ys = [r[f"{phase}_gib_s"] for r in rows]
        if all(y is None for y in ys):
            continue
        errs = [r[f"{phase}_std"] or 0 for r in rows]
        if numeric:
            pts = sorted(zip((float(r[swept[0]]) for r in rows), ys, errs))
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                        capsize=3, color=PHASE_COLOURS[phase], label=phase)
        else:
            offset = -0.2 if phase == "save" else 0.2
            ax.bar([i + offset for i in range(len(rows))], ys, 0.4, yerr=errs, capsize=3,
                   color=PHASE_COLOURS[phase], label=phase)
    if numeric:
        ax.set_xlabel(swept[0])
    else:
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("checkpoint throughput, GiB/s (mean \u00b1 std)")
    ax.set_title("sweep: " + (", ".join(swept) or "no swept parameter"))
    ax.legend()
    if with_goodput:  # the GOODPUT block's figure at the run's own scale, against the setting
        g = axes[0][1]
        ys = [r.get("goodput_pct") for r in rows]
        if numeric:
            pts = sorted((float(r[swept[0]]), y) for r, y in zip(rows, ys) if y is not None)
            g.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="tab:purple")
            g.set_xlabel(swept[0])
        else:
            g.bar(range(len(rows)), [y or 0.0 for y in ys], color="tab:purple")
            g.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
        g.set_ylabel("goodput at the run's interval (%)")
        g.set_title("goodput against the swept setting (each job's GOODPUT, at its own scale)")
    fig.tight_layout()
    return fig


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False
