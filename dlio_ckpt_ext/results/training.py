"""The TRAINING block: what checkpointing cost DLIO's training loop, from each
rank's O(1) summary of the loop (dlio/training.py), merged on the way to rank 0
(an MPI reduction: rank 0 holds O(checkpoints), whatever the ranks): its
summary, its lines in RESULTS, and its panel in the run's picture (step
times, and the loader's rate during the saves and outside them)."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext.engine.profile import GiB
from dlio_ckpt_ext.results.windows import mean_std
from dlio_ckpt_ext.dlio import training
from dlio_ckpt_ext.dlio.training import TrainingLoop


def rank_part(loop: TrainingLoop, saves: list[dict]) -> dict:
    """One rank's view of the loop, in the form merge() combines: sums, and per
    save the extremes the job waits for (the loop goes on only when every rank
    has: DLIO's barrier after each step)."""
    timed = loop.first_start is not None
    wall = max(loop.last_end, max((s["end"] for s in saves), default=0.0)) - loop.first_start if timed else 0.0
    return {"ranks": 1, "steps": loop.steps,
            # each rank's computation over its loop's time, and its time a step: summed, then averaged
            "timed_ranks": int(wall > 0), "au_pct_sum": loop.compute_s / wall * 100 if wall > 0 else 0.0,
            "stepped_ranks": int(loop.steps > 0), "step_s_sum": wall / loop.steps if loop.steps else 0.0,
            "plain_steps": loop.plain_steps, "plain_step_s": loop.plain_step_s,
            "loads": {k: [t.batches, t.nbytes, t.seconds] for k, t in loop.loads.items()},
            "saves": [{"step": s["step"], "epoch": s["epoch"], "iteration": s["iteration"], "start": s["start"],
                       "end": s["end"], "step_s": s["step_s"], "beyond_compute_s": s["step_s"] - s["compute_s"]}
                      for s in saves]}


_SUMS = ("ranks", "timed_ranks", "au_pct_sum", "stepped_ranks", "step_s_sum", "plain_steps", "plain_step_s")


def merge(a: dict, b: dict) -> dict:
    """Two parts as one (associative and commutative: mpi4py's reduce op)."""
    out = {k: a[k] + b[k] for k in _SUMS}
    out["steps"] = max(a["steps"], b["steps"])
    out["loads"] = {k: [x + y for x, y in zip(a["loads"][k], b["loads"][k])] for k in a["loads"]}
    out["saves"] = [{**x, "start": min(x["start"], y["start"]), "end": max(x["end"], y["end"]),
                     "step_s": max(x["step_s"], y["step_s"]),
                     "beyond_compute_s": max(x["beyond_compute_s"], y["beyond_compute_s"])}
                    for x, y in zip(a["saves"], b["saves"])]
    return out


def _rate(nbytes: int, seconds: float) -> Optional[float]:
    return nbytes / GiB / seconds if seconds > 0 else None


def training_summary(merged: dict, dlio: dict, mode: str) -> dict:
    """Rank 0: the run's figures from every rank's part, merged. mode: how saves ran (sync, async, tiers)."""
    checkpoints = [{"checkpoint": i + 1, "iteration": c["iteration"], "step": c["step"], "epoch": c["epoch"],
                    "stall_s": c["end"] - c["start"], "saving_step_s": c["step_s"],
                    "beyond_compute_s": c["beyond_compute_s"]} for i, c in enumerate(merged["saves"])]
    plain = merged["plain_steps"]
    plain_s = merged["plain_step_s"] / plain if plain else None
    loads = {}
    for kind, (batches, nbytes, seconds) in merged["loads"].items():
        # per rank: each rank's loop waits for its own batches
        loads[kind] = {"batches": batches, "bytes": nbytes, "seconds": seconds,
                       "gib_s_per_rank": _rate(nbytes, seconds)}
    during, clear = loads["during_save"]["gib_s_per_rank"], loads["no_save"]["gib_s_per_rank"]
    stalls = [c["stall_s"] for c in checkpoints]
    stall_mean, stall_std = mean_std(stalls) if stalls else (0.0, 0.0)
    saving = [c["saving_step_s"] for c in checkpoints]
    timed, stepped = merged["timed_ranks"], merged["stepped_ranks"]
    return {"mode": mode, "ranks": merged["ranks"], "steps_per_rank": merged["steps"],
            "checkpoints": checkpoints,
            # the goodput figure's input: what the loop waited for each checkpoint
            "checkpoint_stall_s": stalls, "checkpoint_stall_mean_s": stall_mean,
            "checkpoint_stall_stdev_s": stall_std, "checkpoint_stall_max_s": max(stalls, default=0.0),
            "plain_step_s": plain_s,
            "saving_step_mean_s": sum(saving) / len(saving) if saving else None,
            "au_with_checkpoints_pct": merged["au_pct_sum"] / timed if timed else None,
            # the loop's time a step, saves included (mean of ranks)
            "step_mean_s": merged["step_s_sum"] / stepped if stepped else None,
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


# -- a training run's end, on every rank (`session`: the CheckpointSession) ------------------


def summarise(session) -> None:
    """Collective, once the loop is over: every rank's view of it, merged on the way to rank 0."""
    with session.abort_on_error("summarising the training loop"):
        merged = session.comm.reduce(rank_part(training.loop(), session.training_saves),
                                  op=merge, root=0)
        if session.rank == 0:
            mode = "tiers" if session.config.has_tiers else "async" if session.config.is_async else "sync"
            session.training_summary = training_summary(
                merged, training.dlio_figures(training.loop().stats), mode)

def read_after(session) -> None:
    """The newest num_checkpoints_read checkpoints the loop saved, read back
    as DLIO's checkpoint-only read phase reads (every rank its own files,
    between barriers): DLIO's training loop itself reads none."""
    wanted = session.config.checkpoint.num_checkpoints_read
    chosen = session.saved[-wanted:]
    if session.rank == 0:
        short = f"; only {len(session.saved)} were saved" if len(chosen) < wanted else ""
        print(f"[INFO] reading back the {len(chosen)} newest of the {len(session.saved)} checkpoints the training "
              f"loop saved (checkpoint.num_checkpoints_read={wanted}{short})", flush=True)
    for step, epoch in chosen:
        session.comm.barrier()
        session.load(epoch, step)
        if session.rank_sync:
            session.comm.barrier()


# -- its panel in the run's picture (dlio-ckpt-report run) -----------------------


def panel(record: dict, ax) -> None:
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


KEY = "training"


def drawn(block: dict) -> bool:
    return bool(block.get("checkpoints"))
