"""The TIERS block of a tiered run: what its local saves cost the foreground,
and whether each persistent save fit in its interval, all from the global
windows the record keeps (so `dlio-ckpt-report` and a reader can redo it):
its summary for the record, its lines in RESULTS, its warnings, and its panel
in the run's picture (a timeline of the saves against their intervals)."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext.results import windows
from dlio_ckpt_ext.engine.profile import GiB


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def tiers_summary(local: list[dict], persist: list[dict], interval_s: float, ranks: int,
                  async_rows: Optional[list[dict]] = None) -> dict:
    """local, persist: the global windows of the local and persistent saves;
    async_rows: async_checkpoints' rows (the foreground's staging and wait for each persistent save)."""
    saves = []
    for w in local:
        duration = w["duration_s"]
        hosts = list(w["hosts"].values())
        saves.append({"step": w["step"], "start": w["start"], "duration_s": duration, "bytes": w["bytes"],
                      "gib_s": w["throughput_gib_s"],
                      "per_rank_gib_s": w["bytes"] / ranks / GiB / duration if duration > 0 else 0.0,
                      "per_node_gib_s": sum(h["throughput_gib_s"] for h in hosts) / len(hosts),
                      "during_persist": any(overlaps(w, p) for p in persist)})
    blocked = {r["step"]: r for r in async_rows or []}
    persistent = []
    for p in persist:
        row = {"step": p["step"], "start": p["start"], "duration_s": p["duration_s"], "gib_s": p["throughput_gib_s"],
               "interval_s": interval_s, "slack_s": interval_s - p["duration_s"],
               "fit": p["duration_s"] <= interval_s}
        if p["step"] in blocked:
            row.update(staging_s=blocked[p["step"]]["staging_s"], wait_s=blocked[p["step"]]["wait_s"])
        persistent.append(row)
    during = [s["duration_s"] for s in saves if s["during_persist"]]
    alone = [s["duration_s"] for s in saves if not s["during_persist"]]
    mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return {"local": saves, "persistent": persistent,
            "local_s_mean": mean([s["duration_s"] for s in saves]),
            "local_gib_s_mean": mean([s["gib_s"] for s in saves]),
            "local_per_rank_gib_s_mean": mean([s["per_rank_gib_s"] for s in saves]),
            "local_per_node_gib_s_mean": mean([s["per_node_gib_s"] for s in saves]),
            "local_during_persist": len(during), "local_alone": len(alone),
            "local_s_during_persist": mean(during), "local_s_alone": mean(alone),
            "foreground_slowdown": mean(during) / mean(alone) if during and alone and mean(alone) else None,
            "persistent_fit": sum(r["fit"] for r in persistent), "persistent_saves": len(persistent)}


def tiers_lines(s: dict, settings: dict) -> list[str]:
    """settings: the run's tiers section, plus the priority its persists ran at;
    none for a run that only came back from a failure (it saved nothing)."""
    n = len(s["local"])
    if not n:
        return []
    lines = [f"TIERS (local_root {settings['local_root']}: every checkpoint, replication {settings['replication']}; "
             f"the storage under test: {_every(settings['persistent_every'])}):",
             f"  {'local saves':28s} {n}, {s['local_s_mean']:.4f} s each, {s['local_gib_s_mean']:.4f} GiB/s "
             f"({s['local_per_rank_gib_s_mean']:.4f} per rank, {s['local_per_node_gib_s_mean']:.4f} per node)"]
    if s["foreground_slowdown"] is not None:
        lines.append(f"  {'local save with a persist':28s} {s['local_s_during_persist']:.4f} s ({s['local_during_persist']}"
                     f" saves) against {s['local_s_alone']:.4f} s without ({s['local_alone']}): "
                     f"{s['foreground_slowdown']:.2f}x (the background save's cost to the foreground)")
    else:
        lines.append(f"  {'local save with a persist':28s} n/a: {s['local_during_persist']} local save(s) ran beside "
                     f"a persist, {s['local_alone']} without; the ratio needs both")
    for r in s["persistent"]:
        staged = (f"; the foreground staged it in {r['staging_s']:.4f} s and waited {r['wait_s']:.4f} s for the "
                  "previous one" if "staging_s" in r else "")
        lines.append(f"  {'persistent save ' + str(r['step']):28s} {r['duration_s']:.4f} s at {r['gib_s']:.4f} "
                     f"GiB/s, interval {r['interval_s']:g} s, slack {r['slack_s']:.4f} s, "
                     f"{'fit' if r['fit'] else 'DID NOT FIT'}{staged}")
    lines.append(f"  {'persistent saves that fit':28s} {s['persistent_fit']} of {s['persistent_saves']} (persist "
                 f"thread at nice {settings['nice']}, I/O class {settings['io_class']})")
    return lines


def _every(n: int) -> str:
    if n == 1:
        return "every checkpoint"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix} checkpoint"


def overrun_warnings(s: dict) -> list[str]:
    late = [r for r in s["persistent"] if not r["fit"]]
    if not late:
        return []
    return [f"[WARNING] persistent save(s) of checkpoint step(s) {windows.listed([r['step'] for r in late])} did not "
            f"fit in their {late[0]['interval_s']:g} s interval (workload.tiers.interval_s): "
            + ", ".join(f"{r['duration_s']:.3f} s" for r in late[:8])
            + "; the storage under test cannot keep this schedule"]


def settings(session) -> dict:
    """The tiers section as run, with the priority the persists really ran at."""
    t = session.config.tiers
    return {"local_root": t.local_root, "persistent_every": t.persistent_every, "replication": t.replication,
            "replication_jump": session.tier.apart if session.tier else t.replication_jump,
            "interval_s": session.config.persistent_interval_s,
            "nice": session.persist_priority.get("nice", t.persistent_nice),
            "io_class": session.persist_priority.get("io_class", t.persistent_io),
            "same_file_system": session.tier_note is not None}


# -- its panel in the run's picture (dlio-ckpt-report run) -----------------------


def panel(record: dict, ax) -> None:
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


#: the record key that says a run has the block, and whether it has something to draw
KEY = "tiers"


def drawn(block: dict) -> bool:
    return bool(block.get("local"))  # a tiered run that only came back from a failure saved nothing
