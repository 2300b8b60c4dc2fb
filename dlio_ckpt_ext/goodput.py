"""The share of a training job's time that is useful work, given what its
checkpoints cost it: the arithmetic `dlio-ckpt-report goodput` applies to a
run's measured figures (docs/goodput.md).

The model (first order in the failure rate, as Young's and Daly's):
- a job works `interval_s` (tau), then stalls `stall_s` (s) while it saves: a
  synchronous save's time, an asynchronous save's staging, a local-tier save;
  a cycle is tau + s (a tier saving every K-th cycle stalls s / K a cycle);
- a save captures the state when its stall starts and is durable `lag_s` (P)
  after the stall ends (a background persist; 0 for a synchronous save);
- failures strike at exponential times, `mtbf_s` (M) apart on average:
  M = 1 / (nodes x failures per node and day);
- a failure costs the restart outside storage (R0: scheduler, start-up,
  compilation), the restore (r), and the work since the newest durable save's
  state: a save every K cycles is durable s + P after its capture, so the work
  lost is uniform on [s + P, s + P + K(tau + s)), K(tau + s) / 2 + s + P on average.

With F the share of time failures take, sum over tiers of share x (R0 + r + lost) / M,
goodput = (1 - F) tau / (tau + s), and the badput splits into the save stall
((1 - F) s / (tau + s)), the restart, the restore and the lost work, as
ml-goodput-measurement names them (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME,
INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME,
WASTED_PROGRESS_FROM_DISRUPTION). The best interval is Daly's higher-order
form (J. T. Daly, "A higher order estimate of the optimum checkpoint interval
for restart dumps", FGCS 22(3), 2006; as LLNL's scr_ckpt_interval.py computes
it), which refines Young's sqrt(2 s M) (J. W. Young, CACM 17(9), 1974).
tests/test_goodput.py checks the closed form against a simulation written apart."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

DAY_S = 86400.0
#: Llama 3's pretraining: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs
#: (2,048 nodes of 8): a failure every 3.1 h, 3.8e-3 a node and day ("The Llama 3 Herd of
#: Models", Meta, 2024, section 3.3.4)
LLAMA3_FAILURES_PER_NODE_DAY = 3.8e-3
FAILURE_SOURCE = ("Llama 3's pretraining, 419 interruptions in 54 days on 2,048 nodes of 8 H100: "
                  "3.8e-3 failures a node and day")


#: the model holds (within 2 % of the simulation) while durable saves are at most this share
#: of the MTBF apart
FIRST_ORDER_SPAN = 0.1


@dataclass(frozen=True)
class Tier:
    """One tier's saves as the job sees them."""
    stall_s: float          # s: the foreground's stall a save of this tier costs
    lag_s: float            # P: after the stall, until the save is durable
    restore_s: float        # r: a restore from this tier
    every: int = 1          # K: this tier saves every K-th cycle
    share: float = 1.0      # the share of failures this tier's saves recover


def mtbf_s(nodes: int, failures_per_node_day: float = LLAMA3_FAILURES_PER_NODE_DAY) -> float:
    """The job's mean time between failures: M = 1 / (nodes x rate)."""
    return DAY_S / (nodes * failures_per_node_day)


def stall_per_cycle(tiers: list[Tier]) -> float:
    return sum(t.stall_s / t.every for t in tiers)


def badput(interval_s: float, tiers: list[Tier], mtbf: float, restart_s: float = 0.0) -> dict:
    """Goodput and its badput categories, each a share of the job's time (they add up to 1)."""
    if interval_s <= 0 or mtbf <= 0:
        raise ValueError("the interval and the mean time between failures must be positive")
    stall = stall_per_cycle(tiers)
    cycle = interval_s + stall
    restore = sum(t.share * t.restore_s for t in tiers) / mtbf
    lost = sum(t.share * (t.every * cycle / 2 + t.stall_s + t.lag_s) for t in tiers) / mtbf
    restart = sum(t.share for t in tiers) * restart_s / mtbf
    failures = restart + restore + lost
    working = max(0.0, 1.0 - failures)
    span = max(t.every for t in tiers if t.share > 0) * cycle if any(t.share > 0 for t in tiers) else cycle
    return {"goodput": working * interval_s / cycle, "save_stall": working * stall / cycle,
            "restart": restart, "restore": restore, "lost_work": lost,
            "interval_s": interval_s, "stall_s": stall, "mtbf_s": mtbf,
            # first order: within 2 % of a simulation while durable saves come a tenth of the MTBF apart
            # or closer; beyond, it overstates the work lost (tests/test_goodput.py)
            "first_order_holds": span <= FIRST_ORDER_SPAN * mtbf}


def daly_interval(stall_s: float, mtbf: float) -> float:
    """Daly's higher-order optimum: sqrt(2 s M) [1 + sqrt(s / 2M) / 3 + (s / 2M) / 9] - s
    when s < 2M, else M."""
    if stall_s <= 0:
        return 0.0
    if stall_s >= 2 * mtbf:
        return mtbf
    x = stall_s / (2 * mtbf)
    return math.sqrt(2 * stall_s * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - stall_s


def young_interval(stall_s: float, mtbf: float) -> float:
    return math.sqrt(2 * stall_s * mtbf)


def best(tiers: list[Tier], mtbf: float, restart_s: float = 0.0) -> dict:
    """badput at Daly's interval for the stall a cycle costs."""
    interval = max(daly_interval(stall_per_cycle(tiers), mtbf), 1e-9)
    return badput(interval, tiers, mtbf, restart_s)


# -- a run's record through the model (the GOODPUT block, dlio-ckpt-report goodput) --


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def measured(s: dict, interval_s: Optional[float] = None) -> dict:
    """The model's inputs from a run's record: each tier's stall, lag and restore,
    and the interval, with where each came from."""
    save, load = s["save"], s["load"]
    restore = load.get("duration_s_mean") if load.get("checkpoints") else None
    # a recovery's time to resume (discovery included) is a restore as a failed job makes it
    resumed = {r["tier"]: r["time_to_resume_s"] for r in s.get("recovery") or []}
    restore = resumed.get("persistent", restore)
    said = []
    if restore is None:
        restore = save["duration_s_mean"]
        said.append("no checkpoint was read: a restore assumed as long as a save")
    training = s.get("training")
    tiers = s.get("tiers")
    if tiers:
        settings = tiers["settings"]
        staging = _mean([r["staging_s"] for r in tiers["persistent"] if "staging_s" in r]) or 0.0
        local_restore = resumed.get("local")
        if local_restore is None:
            local_restore = tiers["local_s_mean"] or 0.0
            said.append("a local restore assumed as long as a local save")
        local = Tier(tiers["local_s_mean"] or 0.0, 0.0, local_restore)
        persistent = Tier(staging, save["duration_s_mean"], restore, every=settings["persistent_every"])
        kind, parts = "tiers", [local, persistent]
        interval = settings.get("interval_s") or None
    elif s.get("async"):
        kind = "async"
        parts = [Tier(s["async"]["blocked_s"]["mean"], save["duration_s_mean"], restore)]
        interval = s["async"].get("interval_s") or None
    else:
        kind = "sync"
        parts = [Tier(save["duration_s_mean"], 0.0, restore)]
        interval = s["config"]["effective"].get("checkpoint", {}).get("time_between_checkpoints") or None
    if training and training.get("checkpoint_stall_mean_s") and kind != "tiers":
        parts = [Tier(training["checkpoint_stall_mean_s"], parts[0].lag_s, restore)]
        iterations = [c["iteration"] for c in training["checkpoints"]]
        if len(iterations) > 1 and training.get("plain_step_s"):
            interval = (iterations[1] - iterations[0]) * training["plain_step_s"]
    if interval_s:
        interval = interval_s
    return {"kind": kind, "tiers": parts, "interval_s": float(interval) if interval else None, "notes": said}


def at_scale(inputs: dict, run_nodes: int, nodes: int) -> list[Tier]:
    """Each tier's times at `nodes`: the checkpoint's bytes spread over the nodes, at the
    bandwidth a node had in this run (assumed to hold per node)."""
    f = run_nodes / nodes
    return [Tier(t.stall_s * f, t.lag_s * f, t.restore_s * f, t.every, t.share) for t in inputs["tiers"]]


def scales(s: dict, nodes: list[int], failures_per_node_day: float, restart_s: float,
           interval_s: Optional[float] = None, local_share: Optional[float] = None) -> dict:
    """A run's record (its summary) through the model: the inputs read from it, and a row a
    scale (the run's own first) and a local share (tiered runs: 0 and 1 unless given), with
    goodput, the badput split and Daly's best interval. None when the run has no interval."""
    inputs = measured(s, interval_s)
    if not inputs["interval_s"]:
        return None
    run_nodes = s.get("num_hosts") or len(s.get("hosts", [])) or 1
    shares = [local_share] if local_share is not None else ([0.0, 1.0] if inputs["kind"] == "tiers" else [None])
    rows = []
    for n in [run_nodes] + [x for x in nodes if x != run_nodes]:
        mtbf = mtbf_s(n, failures_per_node_day)
        for share in shares:
            tiers = at_scale(inputs, run_nodes, n)
            if share is not None:
                tiers = [Tier(t.stall_s, t.lag_s, t.restore_s, t.every, q) for t, q in zip(tiers, (share, 1 - share))]
            rows.append({"nodes": n, "local_share": share, "at_interval": badput(inputs["interval_s"], tiers, mtbf,
                                                                                restart_s),
                         "at_best": best(tiers, mtbf, restart_s), "tiers": [vars(t) for t in tiers]})
    return {"kind": inputs["kind"], "run_nodes": run_nodes, "interval_s": inputs["interval_s"],
            "tiers": [vars(t) for t in inputs["tiers"]], "notes": inputs["notes"],
            "failures_per_node_day": failures_per_node_day, "restart_s": restart_s,
            "bandwidth": "this run's a node, assumed to hold per node at every scale", "rows": rows}
