"""dlio-ckpt-report goodput: what a run's checkpoint figures cost a training job,
at the run's scale and at the scales named (dlio_ckpt_ext/goodput.py has the
model, docs/goodput.md the sources and its limits)."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext import goodput
from dlio_ckpt_ext.report.results import ResultsError


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def measured(s: dict, interval_s: Optional[float] = None) -> dict:
    """The model's inputs from a run's record: each tier's stall, lag and restore,
    and the interval, with where each came from."""
    save, load = s["save"], s["load"]
    restore = load.get("duration_s_mean") if load.get("checkpoints") else None
    said = []
    if restore is None:
        restore = save["duration_s_mean"]
        said.append("no checkpoint was read: a restore assumed as long as a save")
    training = s.get("training")
    tiers = s.get("tiers")
    if tiers:
        settings = tiers["settings"]
        staging = _mean([r["staging_s"] for r in tiers["persistent"] if "staging_s" in r]) or 0.0
        local = goodput.Tier(tiers["local_s_mean"] or 0.0, 0.0, tiers["local_s_mean"] or 0.0)
        persistent = goodput.Tier(staging, save["duration_s_mean"], restore, every=settings["persistent_every"])
        said.append("a local restore assumed as long as a local save")
        kind, parts = "tiers", [local, persistent]
        interval = settings.get("interval_s") or None
    elif s.get("async"):
        kind = "async"
        parts = [goodput.Tier(s["async"]["blocked_s"]["mean"], save["duration_s_mean"], restore)]
        interval = s["async"].get("interval_s") or None
    else:
        kind = "sync"
        parts = [goodput.Tier(save["duration_s_mean"], 0.0, restore)]
        interval = s["config"]["effective"].get("checkpoint", {}).get("time_between_checkpoints") or None
    if training and training.get("checkpoint_stall_mean_s") and kind != "tiers":
        parts = [goodput.Tier(training["checkpoint_stall_mean_s"], parts[0].lag_s, restore)]
        iterations = [c["iteration"] for c in training["checkpoints"]]
        if len(iterations) > 1 and training.get("plain_step_s"):
            interval = (iterations[1] - iterations[0]) * training["plain_step_s"]
    if interval_s:
        interval = interval_s
    if not interval:
        raise ResultsError("the run says no interval between checkpoints (no tiers.interval_s, training loop or "
                           "checkpoint.time_between_checkpoints): give --interval-s")
    return {"kind": kind, "tiers": parts, "interval_s": float(interval), "notes": said}


def at_scale(inputs: dict, run_nodes: int, nodes: int) -> list[goodput.Tier]:
    """Each tier's times at `nodes`: the checkpoint's bytes spread over the nodes, at the
    bandwidth a node had in this run (assumed to hold per node)."""
    f = run_nodes / nodes
    return [goodput.Tier(t.stall_s * f, t.lag_s * f, t.restore_s * f, t.every, t.share) for t in inputs["tiers"]]


def goodput_lines(s: dict, nodes: list[int], failures_per_node_day: float, restart_s: float,
                  interval_s: Optional[float] = None, local_share: Optional[float] = None) -> list[str]:
    inputs = measured(s, interval_s)
    run_nodes = s.get("num_hosts") or len(s.get("hosts", [])) or 1
    shares = [local_share] if local_share is not None else ([0.0, 1.0] if inputs["kind"] == "tiers" else [None])
    pct = lambda v: f"{100 * v:.2f} %"  # noqa: E731
    first = inputs["tiers"][0]
    lines = ["GOODPUT (dlio_ckpt_ext/goodput.py; docs/goodput.md):",
             f"  failures                     {failures_per_node_day:g} a node and day"
             + (f" ({goodput.FAILURE_SOURCE})" if failures_per_node_day == goodput.LLAMA3_FAILURES_PER_NODE_DAY else ""),
             f"  restart outside storage      {restart_s:g} s" + ("" if restart_s else " (not given: --restart-s)"),
             f"  this run ({inputs['kind']})              {run_nodes} node(s): stall {first.stall_s:.3f} s a "
             f"checkpoint, durable {first.lag_s:.3f} s after, restore {first.restore_s:.3f} s; interval "
             f"{inputs['interval_s']:g} s"]
    if inputs["kind"] == "tiers":
        p = inputs["tiers"][1]
        lines.append(f"  {'persistent tier':28s} every {p.every}th save: stall {p.stall_s:.3f} s, durable "
                     f"{p.lag_s:.3f} s after, restore {p.restore_s:.3f} s")
    lines += [f"  note: {n}" for n in inputs["notes"]]
    lines.append("  at other scales: the checkpoint's bytes spread over the nodes, each node's bandwidth this "
                 "run's (assumed to scale per node)")
    lines.append(f"  {'nodes':>6} {'local share':>11} {'MTBF':>9} {'interval':>9} {'goodput':>9} {'stall':>8} "
                 f"{'restart':>8} {'restore':>8} {'lost':>8} | {'best':>9} {'goodput':>9}")
    for n in [run_nodes] + [x for x in nodes if x != run_nodes]:
        mtbf = goodput.mtbf_s(n, failures_per_node_day)
        for share in shares:
            tiers = at_scale(inputs, run_nodes, n)
            if share is not None:
                tiers = [goodput.Tier(t.stall_s, t.lag_s, t.restore_s, t.every, q)
                         for t, q in zip(tiers, (share, 1 - share))]
            b = goodput.badput(inputs["interval_s"], tiers, mtbf, restart_s)
            top = goodput.best(tiers, mtbf, restart_s)
            flag = "" if b["first_order_holds"] and top["first_order_holds"] else "  (beyond the model's first order)"
            lines.append(f"  {n:>6} {'' if share is None else f'{share:g}':>11} {mtbf / 3600:>8.2f}h "
                         f"{inputs['interval_s']:>8.0f}s {pct(b['goodput']):>9} {pct(b['save_stall']):>8} "
                         f"{pct(b['restart']):>8} {pct(b['restore']):>8} {pct(b['lost_work']):>8} | "
                         f"{top['interval_s']:>8.0f}s {pct(top['goodput']):>9}{flag}")
    return lines
