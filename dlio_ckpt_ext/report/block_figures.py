"""The headline figures of the blocks beyond save and load (TIERS, RECOVERY,
TRAINING, GOODPUT), read from a record, for `compare` (side by side) and
`sweep` (a column each, and goodput drawn against the swept setting)."""
from __future__ import annotations

from typing import Optional


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def run_goodput(summary: dict) -> Optional[dict]:
    """The GOODPUT row at the run's own scale (a tiered run's: the local tier recovering nothing)."""
    g = summary.get("goodput")
    return g["rows"][0] if g and g.get("rows") else None


#: (block, figure, unit, how it is read from the record), in the order printed
FIGURES = [
    ("tiers", "persistent saves that fit", "share", lambda s: s["tiers"]["persistent_fit"] / s["tiers"][
        "persistent_saves"] if s["tiers"].get("persistent_saves") else None),
    ("tiers", "persist slack mean", "s", lambda s: _mean([r["slack_s"] for r in s["tiers"]["persistent"]])),
    ("tiers", "local save mean", "s", lambda s: s["tiers"].get("local_s_mean")),
    ("tiers", "foreground slowdown", "x", lambda s: s["tiers"].get("foreground_slowdown")),
    ("recovery", "time to resume mean", "s", lambda s: _mean([r["time_to_resume_s"] for r in s["recovery"]])),
    ("recovery", "discovery mean", "s", lambda s: _mean([r["discovery_s"] for r in s["recovery"]])),
    ("training", "checkpoint stall mean", "s", lambda s: s["training"].get("checkpoint_stall_mean_s")),
    ("training", "AU with the checkpoints", "%", lambda s: s["training"].get("au_with_checkpoints_pct")),
    ("training", "loader during / otherwise", "x", lambda s: s["training"].get("loader_during_save_ratio")),
    ("goodput", "goodput at the run's interval", "%",
     lambda s: 100 * run_goodput(s)["at_interval"]["goodput"] if run_goodput(s) else None),
    ("goodput", "best interval", "s", lambda s: run_goodput(s)["at_best"]["interval_s"] if run_goodput(s) else None),
]


def block_figures(summary: dict) -> dict[str, Optional[float]]:
    """`block: figure (unit)` -> its value, for every block the record holds."""
    out = {}
    for block, name, unit, read in FIGURES:
        if summary.get(block):
            out[f"{block}: {name} ({unit})"] = read(summary)
    return out
