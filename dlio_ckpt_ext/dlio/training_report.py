"""The TRAINING block: what checkpointing cost DLIO's training loop, from each
rank's O(1) summary of the loop (dlio/training.py) gathered once at the end."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext.dlio.metrics import GiB, mean_std
from dlio_ckpt_ext.dlio.training import TrainingLoop


def rank_part(loop: TrainingLoop, saves: list[dict]) -> dict:
    """What rank 0 needs of one rank: its loop's totals and its save calls
    (O(checkpoints), as the checkpoint windows are)."""
    timed = loop.first_start is not None
    wall = max(loop.last_end, max((s["end"] for s in saves), default=0.0)) - loop.first_start if timed else 0.0
    return {"steps": loop.steps, "compute_s": loop.compute_s, "wall_s": wall,
            "plain_steps": loop.plain_steps, "plain_step_s": loop.plain_step_s,
            "loads": {k: [t.batches, t.nbytes, t.seconds] for k, t in loop.loads.items()},
            "saves": [{k: s[k] for k in ("step", "epoch", "iteration", "start", "end", "step_s", "compute_s")} for s in saves]}


def _rate(nbytes: int, seconds: float) -> Optional[float]:
    return nbytes / GiB / seconds if seconds > 0 else None


def training_summary(parts: list[dict], dlio: dict, mode: str) -> dict:
    """Rank 0: the run's figures from every rank's part. mode: how saves ran (sync, async, tiers)."""
    checkpoints = []
    for i, first in enumerate(parts[0]["saves"]):
        calls = [p["saves"][i] for p in parts]
        start, end = min(c["start"] for c in calls), max(c["end"] for c in calls)
        # the loop goes on only when every rank has (DLIO's barrier after each step)
        step_s = max(c["step_s"] for c in calls)
        checkpoints.append({"checkpoint": i + 1, "iteration": first["iteration"], "step": first["step"],
                            "epoch": first["epoch"],
                            "stall_s": end - start, "saving_step_s": step_s,
                            "beyond_compute_s": max(c["step_s"] - c["compute_s"] for c in calls)})
    plain = sum(p["plain_steps"] for p in parts)
    plain_s = sum(p["plain_step_s"] for p in parts) / plain if plain else None
    loads = {}
    for kind in ("during_save", "no_save"):
        batches = sum(p["loads"][kind][0] for p in parts)
        nbytes = sum(p["loads"][kind][1] for p in parts)
        seconds = sum(p["loads"][kind][2] for p in parts)
        # per rank: each rank's loop waits for its own batches
        loads[kind] = {"batches": batches, "bytes": nbytes, "seconds": seconds,
                       "gib_s_per_rank": _rate(nbytes, seconds)}
    during, clear = loads["during_save"]["gib_s_per_rank"], loads["no_save"]["gib_s_per_rank"]
    au = [p["compute_s"] / p["wall_s"] * 100 for p in parts if p["wall_s"] > 0]
    step = [p["wall_s"] / p["steps"] for p in parts if p["steps"]]
    stalls = [c["stall_s"] for c in checkpoints]
    stall_mean, stall_std = mean_std(stalls) if stalls else (0.0, 0.0)
    saving = [c["saving_step_s"] for c in checkpoints]
    return {"mode": mode, "ranks": len(parts), "steps_per_rank": parts[0]["steps"],
            "checkpoints": checkpoints,
            # the goodput figure's input: what the loop waited for each checkpoint
            "checkpoint_stall_s": stalls, "checkpoint_stall_mean_s": stall_mean,
            "checkpoint_stall_stdev_s": stall_std, "checkpoint_stall_max_s": max(stalls, default=0.0),
            "plain_step_s": plain_s,
            "saving_step_mean_s": sum(saving) / len(saving) if saving else None,
            "au_with_checkpoints_pct": sum(au) / len(au) if au else None,
            # the loop's time a step, saves included (mean of ranks)
            "step_mean_s": sum(step) / len(step) if step else None,
            "dlio": dlio, "data_loader": loads,
            "loader_during_save_ratio": during / clear if during and clear else None}


def training_lines(s: dict) -> list[str]:
    fmt = lambda v, spec, unit="": "n/a" if v is None else format(v, spec) + unit  # noqa: E731
    d = s["dlio"]
    n = len(s["checkpoints"])
    lines = [f"TRAINING (DLIO's training loop: {s['ranks']} ranks, {s['steps_per_rank']} steps a rank, "
             f"{n} checkpoints, saves {s['mode']}):",
             f"  {'DLIO AU':28s} {fmt(d.get('au_mean_pct'), '.2f', ' %')} (DLIO's blocks leave the checkpoints "
             f"out), throughput {fmt(d.get('throughput_mean_samples_s'), '.2f')} samples/s",
             f"  {'AU with the checkpoints':28s} {fmt(s['au_with_checkpoints_pct'], '.2f', ' %')} (computation over "
             "the loop's whole time, saves included; mean of ranks)"]
    if n:
        lines.append(f"  {'checkpoint stall':28s} {s['checkpoint_stall_mean_s']:.4f} s mean "
                     f"(\u00b1{s['checkpoint_stall_stdev_s']:.4f}), {s['checkpoint_stall_max_s']:.4f} s max: the "
                     "save call's window, first rank's start to last rank's return")
        lines.append(f"  {'saving step':28s} {fmt(s['saving_step_mean_s'], '.4f', ' s')} mean against "
                     f"{fmt(s['plain_step_s'], '.4f', ' s')} for a step without a save")
    for kind, label in (("during_save", "data loader during a save"), ("no_save", "data loader otherwise")):
        ld = s["data_loader"][kind]
        if not ld["batches"]:
            why = " (a synchronous save stops the loop: no batch is waited for during one)" \
                if kind == "during_save" and s["mode"] == "sync" else ""
            lines.append(f"  {label:28s} no batches{why}")
            continue
        lines.append(f"  {label:28s} {fmt(ld['gib_s_per_rank'], '.4f', ' GiB/s')} per rank ({ld['batches']} "
                     f"batches, {ld['seconds']:.3f} s waited)")
    if s["loader_during_save_ratio"] is not None:
        lines.append(f"  {'loader during / otherwise':28s} {s['loader_during_save_ratio']:.3f}x (the save's "
                     "interference on the data loader's reads)")
    return lines
