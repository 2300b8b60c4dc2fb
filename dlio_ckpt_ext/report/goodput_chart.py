"""Goodput as a chart on its own (`dlio-ckpt-report goodput --out`): the GOODPUT
block's panel (results/goodput.py), the curves beside the badput bars."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dlio_ckpt_ext.results.goodput import draw_goodput  # noqa: E402


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
