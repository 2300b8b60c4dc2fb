"""The run picture's panels for the blocks beyond save and load, each drawn
from the record alone (the same figures as its RESULTS block): TIERS as a
timeline, RECOVERY's bytes by source and its times, TRAINING's step times and
the data loader's rate during the saves and outside them. `PANELS` lists them
in the picture's order, each with the record key that says the run has it and
the axes it draws on."""
from __future__ import annotations

from typing import Callable

GiB = float(1 << 30)
#: where a recovery's bytes came from, bottom first, with their colours
SOURCES = (("local_bytes", "local tier", "tab:orange"), ("moved_bytes", "from peers", "tab:purple"),
           ("storage_bytes", "storage under test", "tab:blue"))


def tiers_panel(record: dict, ax) -> None:
    """Each local save and persistent save as a bar on the run's clock (a local save red
    while a persist runs beside it), each persist's interval as the frame it must fit in."""
    t = record["tiers"]
    t0 = record["start_time"]
    local = [(s["start"] - t0, s["duration_s"]) for s in t["local"]]
    ax.broken_barh(local, (1.6, 0.8), facecolors=["tab:red" if s["during_persist"] else "tab:orange"
                                                  for s in t["local"]], label="local save (red: beside a persist)")
    ax.broken_barh([(p["start"] - t0, p["interval_s"]) for p in t["persistent"]], (0.5, 0.8), facecolors="none",
                   edgecolors="tab:gray", linestyle="--", label="its interval")
    ax.broken_barh([(p["start"] - t0, p["duration_s"]) for p in t["persistent"]], (0.6, 0.6),
                   facecolors=["tab:blue" if p["fit"] else "tab:red" for p in t["persistent"]],
                   label="persistent save (red: did not fit)")
    ax.set_yticks([0.9, 2.0], ["persistent", "local"])
    ax.set_xlabel("seconds since the run started")
    slowdown = t.get("foreground_slowdown")
    ax.set_title(f"TIERS: {t['persistent_fit']} of {t['persistent_saves']} persistent saves fit their interval; "
                 "a local save beside a persist " + (f"{slowdown:.2f}x as long" if slowdown else "n/a"), fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def recovery_panel(record: dict, ax) -> None:
    """Each recovery's bytes by where they came from (GiB), labelled with its discovery and
    its time to resume."""
    rows = record["recovery"]
    labels = [f"{i}: {r['tier']} tier\nfound in {r['discovery_s']:.3f} s, resumed in {r['time_to_resume_s']:.3f} s"
              for i, r in enumerate(rows, 1)]
    left = [0.0] * len(rows)
    for key, name, colour in SOURCES:
        widths = [r[key] / GiB for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GiB read to resume")
    ax.set_title("RECOVERY: each recovery's bytes by source, its discovery and its time to resume", fontsize=9)
    ax.legend(fontsize=7)


def training_panel(record: dict, ax) -> None:
    """A step without a save and each saving step (s); on the right axis, the data loader's
    GiB/s a rank during the saves and outside them."""
    s = record["training"]
    steps = [("step without a save", s["plain_step_s"])] + [
        (f"saving step {c['checkpoint']}", c["saving_step_s"]) for c in s["checkpoints"]]
    xs = range(len(steps))
    ax.bar(xs, [v or 0.0 for _, v in steps], color=["tab:gray"] + ["tab:blue"] * (len(steps) - 1))
    ax.set_ylabel("seconds a step")
    loader = [("loader during saves", s["data_loader"]["during_save"]["gib_s_per_rank"]),
              ("loader otherwise", s["data_loader"]["no_save"]["gib_s_per_rank"])]
    rates = ax.twinx()
    lx = [len(steps) + 0.5 + i for i in range(2)]
    rates.bar(lx, [v or 0.0 for _, v in loader], color=["tab:red", "tab:green"], width=0.6)
    rates.set_ylabel("data loader GiB/s a rank")
    ax.set_xticks([*xs, *lx], [n for n, _ in steps] + [n for n, _ in loader], rotation=30, ha="right", fontsize=7)
    ax.set_title(f"TRAINING ({s['mode']} saves): step times, and the data loader's rate during the saves and "
                 "outside them", fontsize=9)


#: (record key, its panel) in the picture's order
PANELS: list[tuple[str, Callable]] = [("tiers", tiers_panel), ("recovery", recovery_panel),
                                      ("training", training_panel)]


def panels_of(record: dict) -> list[tuple[str, Callable]]:
    """The panels the run has: those whose block the record holds (a tiered run that only came
    back from a failure saved nothing: no timeline)."""
    out = []
    for key, draw in PANELS:
        block = record.get(key)
        if block and (key != "tiers" or block.get("local")) and (key != "training" or block.get("checkpoints")):
            out.append((key, draw))
    return out
