"""The goodput model (dlio_ckpt_ext/goodput.py) against a simulation written apart
from it: a job's timeline cycle by cycle, exponential failures (during recovery
too), each failure rolling the job back to the newest checkpoint durable when it
struck, then the restart and the restore."""
from __future__ import annotations

import random

import pytest

from dlio_ckpt_ext import goodput

HOUR = 3600.0


def simulate(interval: float, tiers: list[goodput.Tier], mtbf: float, restart: float, failures: int,
             seed: int = 1) -> dict:
    """Run until `failures` failures struck; returns the shares of wall time: useful work,
    save stalls, and the rest (recoveries and work lost)."""
    rng = random.Random(seed)
    t = work = stalls = 0.0
    next_failure = rng.expovariate(1 / mtbf)
    durable = [(-1.0, 0.0)] * len(tiers)   # per tier: (wall time it became durable, work it holds)
    pending: list[tuple[int, float, float]] = []  # (tier, durable at, work captured)
    cycle = struck = 0
    useful = 0.0  # work done and never lost

    def fail(at: float) -> float:
        """The failure at `at`: roll back, then recover (restarted by failures during it)."""
        nonlocal work, next_failure, struck, cycle, pending, durable
        struck += 1
        for tier, ready, captured in pending:
            if ready <= at:
                durable[tier] = (ready, captured)
        pending = []
        u, acc, chosen = rng.random(), 0.0, len(tiers) - 1
        for i, tier in enumerate(tiers):
            acc += tier.share
            if u < acc:
                chosen = i
                break
        work = durable[chosen][1]
        for i in range(len(tiers)):  # a tier's saves newer than the state restored are gone with the timeline
            if durable[i][1] > work:
                durable[i] = (durable[i][0], work)
        cycle = 0
        now = at
        while True:
            next_failure = now + rng.expovariate(1 / mtbf)
            end = now + restart + tiers[chosen].restore_s
            if next_failure >= end:
                return end
            struck += 1
            now = next_failure

    while struck < failures:
        for tier, ready, captured in list(pending):
            if ready <= t:
                durable[tier] = (ready, captured)
                pending.remove((tier, ready, captured))
        if next_failure < t + interval:
            t = fail(next_failure)
            continue
        t += interval
        work += interval
        cycle += 1
        saving = [i for i, tier in enumerate(tiers) if cycle % tier.every == 0]
        stall = sum(tiers[i].stall_s for i in saving)
        if next_failure < t + stall:
            t = fail(next_failure)
            continue
        captured = work
        t += stall
        stalls += stall
        for i in saving:
            pending.append((i, t + tiers[i].lag_s, captured))
        useful = max(useful, work)
    return {"goodput": work / t, "save_stall": stalls / t, "failures": struck, "wall_s": t}


# interval, stall, lag, restore, restart, MTBF: a synchronous save, an async one with a long
# persist, a slow restore with a long restart; the best interval of each
GRID = [
    (600.0, 30.0, 0.0, 60.0, 0.0, 3 * HOUR),
    (1800.0, 30.0, 0.0, 60.0, 300.0, 6 * HOUR),
    (600.0, 5.0, 240.0, 120.0, 120.0, 3 * HOUR),
    (300.0, 2.0, 280.0, 300.0, 600.0, 12 * HOUR),
    (3600.0, 120.0, 0.0, 600.0, 900.0, 24 * HOUR),
]


@pytest.mark.parametrize("interval, stall, lag, restore, restart, mtbf", GRID)
def test_the_closed_form_agrees_with_the_simulation(interval, stall, lag, restore, restart, mtbf):
    tiers = [goodput.Tier(stall, lag, restore)]
    for tau in (interval, goodput.daly_interval(stall, mtbf)):
        model = goodput.badput(tau, tiers, mtbf, restart)
        sim = simulate(tau, tiers, mtbf, restart, failures=3000)
        assert abs(sim["goodput"] - model["goodput"]) <= 0.02 * model["goodput"], (tau, sim, model)
        # the badput itself, not only goodput's near-1 share: within 10 % of it
        assert abs((1 - sim["goodput"]) - (1 - model["goodput"])) <= 0.1 * (1 - model["goodput"]), (tau, sim, model)
        assert abs(sim["save_stall"] - model["save_stall"]) <= 0.05 * model["save_stall"] + 1e-4


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_two_tiers_agree_with_the_simulation_at_any_share_the_local_tier_recovers(share):
    """Local saves every 5 minutes (3 s), persistent every 6th (staged in 1 s, durable 200 s
    later): the failures the local tier recovers lose far less."""
    tiers = [goodput.Tier(3.0, 0.0, 20.0, every=1, share=share), goodput.Tier(1.0, 200.0, 240.0, every=6,
                                                                              share=1 - share)]
    model = goodput.badput(300.0, tiers, 6 * HOUR, 300.0)
    sim = simulate(300.0, tiers, 6 * HOUR, 300.0, failures=3000)
    assert abs(sim["goodput"] - model["goodput"]) <= 0.02 * model["goodput"], (sim, model)
    assert abs((1 - sim["goodput"]) - (1 - model["goodput"])) <= 0.1 * (1 - model["goodput"]), (sim, model)


def test_the_first_order_model_holds_where_it_says_it_does():
    """Beyond a tenth of the MTBF between durable saves the model overstates the work lost
    (failures then strike soon after a restart, when little is at stake); it says so."""
    tiers = [goodput.Tier(30.0, 0.0, 60.0)]
    near = goodput.badput(600.0, tiers, 3 * HOUR, 300.0)
    far = goodput.badput(3000.0, tiers, 3 * HOUR, 300.0)
    assert near["first_order_holds"] and not far["first_order_holds"]
    sim = simulate(3000.0, tiers, 3 * HOUR, 300.0, failures=3000)
    assert far["goodput"] < sim["goodput"]


def test_the_categories_add_up_and_the_best_interval_is_daly_s():
    tiers = [goodput.Tier(30.0, 0.0, 60.0)]
    m = goodput.mtbf_s(2048)
    assert abs(m - 86400 / (2048 * 3.8e-3)) < 1e-6 and 3.0 * HOUR < m < 3.2 * HOUR  # Llama 3: one every 3.1 h
    b = goodput.badput(600.0, tiers, m, 300.0)
    assert abs(sum(b[k] for k in ("goodput", "save_stall", "restart", "restore", "lost_work")) - 1) < 1e-12
    daly = goodput.daly_interval(30.0, m)
    assert goodput.young_interval(30.0, m) - 30 < daly < goodput.young_interval(30.0, m) * 1.05
    # Daly's interval is (near) the best: a little shorter or longer costs goodput
    assert all(goodput.badput(daly * f, tiers, m, 300.0)["goodput"] < goodput.best(tiers, m, 300.0)["goodput"]
               for f in (0.5, 2.0))
    assert goodput.daly_interval(3 * m, m) == m  # a save longer than 2M: checkpoint every M


def record(**extra) -> dict:
    """A run's record, with the figures the goodput report reads."""
    return {"num_hosts": 2, "save": {"checkpoints": 4, "duration_s_mean": 20.0}, "load": {"checkpoints": 2,
            "duration_s_mean": 10.0}, "config": {"effective": {"checkpoint": {"time_between_checkpoints": 0}}},
            **extra}


def test_the_report_reads_each_schedule_s_figures_and_scales_them_per_node():
    from dlio_ckpt_ext.goodput import at_scale, measured, scales
    from dlio_ckpt_ext.results.goodput import goodput_lines
    sync = measured(record(), 600.0)
    assert sync["kind"] == "sync" and sync["tiers"] == [goodput.Tier(20.0, 0.0, 10.0)] and sync["interval_s"] == 600
    asynchronous = measured(record(**{"async": {"blocked_s": {"mean": 2.0}, "interval_s": 300}}))
    assert asynchronous["tiers"] == [goodput.Tier(2.0, 20.0, 10.0)] and asynchronous["interval_s"] == 300
    tiered = measured(record(tiers={"local_s_mean": 4.0, "persistent": [{"staging_s": 1.0}],
                                    "settings": {"persistent_every": 5, "interval_s": 120}}))
    assert tiered["tiers"] == [goodput.Tier(4.0, 0.0, 4.0), goodput.Tier(1.0, 20.0, 10.0, every=5)]
    # bandwidth a node held: 2 nodes' bytes on 1,024 nodes take 2/1,024 of the time
    assert at_scale(sync, 2, 1024) == [goodput.Tier(20.0 * 2 / 1024, 0.0, 10.0 * 2 / 1024)]
    lines = goodput_lines(scales(record(), [1024], goodput.LLAMA3_FAILURES_PER_NODE_DAY, 300.0, 600.0))
    want = goodput.badput(600.0, at_scale(sync, 2, 1024), goodput.mtbf_s(1024), 300.0)
    row = next(line for line in lines if line.split()[:1] == ["1024"])
    assert f"{100 * want['goodput']:.2f} %" in row and f"{100 * want['lost_work']:.2f} %" in row
    two = goodput_lines(scales(record(tiers={"local_s_mean": 4.0, "persistent": [],
                                             "settings": {"persistent_every": 5, "interval_s": 120}}),
                               [2048], 3.8e-3, 0.0))
    assert [line.split()[:2] for line in two if line.split()[:1] == ["2048"]] == [["2048", "0"], ["2048", "1"]]
    assert any("restart outside storage      0 s (not given)" in line for line in two)


def test_a_recovery_s_time_to_resume_is_the_restore_of_its_tier():
    from dlio_ckpt_ext.goodput import measured
    tiers = {"local_s_mean": 4.0, "persistent": [{"staging_s": 1.0}],
             "settings": {"persistent_every": 5, "interval_s": 120}}
    local = measured(record(tiers=tiers, recovery=[{"tier": "local", "time_to_resume_s": 1.5}]))
    assert local["tiers"] == [goodput.Tier(4.0, 0.0, 1.5), goodput.Tier(1.0, 20.0, 10.0, every=5)]
    assert not any("local restore assumed" in n for n in local["notes"])
    persistent = measured(record(tiers=tiers, recovery=[{"tier": "persistent", "time_to_resume_s": 12.5}]))
    assert persistent["tiers"] == [goodput.Tier(4.0, 0.0, 4.0), goodput.Tier(1.0, 20.0, 12.5, every=5)]
    resumed = measured(record(load={}, recovery=[{"tier": "persistent", "time_to_resume_s": 7.0}]), 600.0)
    assert resumed["tiers"] == [goodput.Tier(20.0, 0.0, 7.0)] and not resumed["notes"]


def test_a_run_without_an_interval_is_asked_for_one():
    from dlio_ckpt_ext.goodput import scales
    from dlio_ckpt_ext.results.goodput import goodput_lines
    from dlio_ckpt_ext.report.goodput_report import goodput_report
    from dlio_ckpt_ext.report.results import ResultsError
    with pytest.raises(ResultsError, match="give --interval-s"):
        goodput_report(record(), [1024], 3.8e-3, 0.0)
    assert scales(record(), [1024], 3.8e-3, 0.0) is None
    assert "set workload.goodput.interval_s" in goodput_lines(None)[0]


@pytest.mark.e2e
def test_a_run_prints_its_goodput_block_from_its_own_figures(tmp_path):
    """RESULTS end with GOODPUT: the run's save and restore times through the model at its
    scale and the scales named, the same figures in the record."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dlio_run import run_dlio
    run = run_dlio(tmp_path, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=2",
                   "++workload.checkpoint.num_checkpoints_read=2", "++workload.checkpoint.time_between_checkpoints=1",
                   "++workload.goodput.nodes=[64]", "++workload.goodput.restart_s=120")
    assert run.returncode == 0, run.stderr[-3000:]
    record = run.record()
    g = record["goodput"]
    stall, restore = record["save"]["duration_s_mean"], record["load"]["duration_s_mean"]
    assert g["tiers"] == [{"stall_s": stall, "lag_s": 0.0, "restore_s": restore, "every": 1, "share": 1.0}]
    assert [r["nodes"] for r in g["rows"]] == [1, 64] and g["restart_s"] == 120
    at64 = goodput.badput(1.0, [goodput.Tier(stall / 64, 0.0, restore / 64)], goodput.mtbf_s(64), 120.0)
    assert g["rows"][1]["at_interval"]["goodput"] == pytest.approx(at64["goodput"])
    block = run.stdout[run.stdout.index("GOODPUT (dlio_ckpt_ext/goodput.py"):]
    assert f"{100 * at64['goodput']:.2f} %" in block.splitlines()[7]


@pytest.mark.parametrize("tiered", [False, True])
def test_the_goodput_chart_draws_each_scales_curve_and_badput_as_the_model_computes_them(tiered, tmp_path):
    """Read back from matplotlib's own objects: each curve's points are goodput.badput's at those
    intervals for the row's tiers and MTBF, the run's and the best interval marked on it, the
    shading starts where the first order stops holding, and each bar stack is the row's badput."""
    from dlio_ckpt_ext.goodput import scales
    from dlio_ckpt_ext.report.goodput_chart import goodput_figure
    from dlio_ckpt_ext.results.goodput import BADPUT
    from dlio_ckpt_ext.report.goodput_report import goodput_report
    extra = {"tiers": {"local_s_mean": 4.0, "persistent": [{"staging_s": 1.0}],
                       "settings": {"persistent_every": 5, "interval_s": 120}}} if tiered else {}
    g = scales(record(**extra), [1024, 16384], 3.8e-3, 300.0, None if tiered else 600.0)
    fig = goodput_figure(g)
    curves_ax, bars_ax = fig.axes
    lines = curves_ax.get_lines()
    assert len(g["rows"]) == (6 if tiered else 3)  # the run's 2 nodes first; tiered: local shares 0 and 1
    assert len(lines) == 3 * len(g["rows"])        # a row's curve, its run's point, its best point
    beyond = []
    for i, row in enumerate(g["rows"]):
        line, run, top = lines[3 * i: 3 * i + 3]
        tiers = [goodput.Tier(**t) for t in row["tiers"]]
        mtbf = goodput.mtbf_s(row["nodes"])
        at = [goodput.badput(x, tiers, mtbf, 300.0) for x in line.get_xdata()]
        assert list(line.get_ydata()) == pytest.approx([100 * b["goodput"] for b in at])
        assert len(at) == 80 and line.get_label().startswith(f"{row['nodes']} nodes")
        assert (run.get_xdata()[0], run.get_ydata()[0]) == pytest.approx(
            (g["interval_s"], 100 * goodput.badput(g["interval_s"], tiers, mtbf, 300.0)["goodput"]))
        best = goodput.best(tiers, mtbf, 300.0)
        assert (top.get_xdata()[0], top.get_ydata()[0]) == pytest.approx((best["interval_s"], 100 * best["goodput"]))
        beyond += [next((x for x, b in zip(line.get_xdata(), at) if not b["first_order_holds"]), None)]
    # the shading: a span for each curve that leaves the first order, from where it stops holding
    spans = sorted(p.get_x() if hasattr(p, "get_x") else p.get_xy()[0][0] for p in curves_ax.patches)
    assert spans == pytest.approx(sorted(x for x in beyond if x is not None)) and spans
    # the bars: BADPUT's categories stacked a row, each the row's share in %
    bars = bars_ax.patches
    assert len(bars) == len(BADPUT) * len(g["rows"])
    for k, (key, _, _) in enumerate(BADPUT):
        for i, row in enumerate(g["rows"]):
            assert bars[k * len(g["rows"]) + i].get_height() == pytest.approx(100 * row["at_interval"][key])
    assert [t.get_text() for t in bars_ax.get_xticklabels()] == [
        f"{r['nodes']} nodes" + ("" if r["local_share"] is None else f", local share {r['local_share']:g}")
        for r in g["rows"]]
    # the command writes it
    out = tmp_path / "goodput.png"
    lines_out = goodput_report(record(**extra), [1024, 16384], 3.8e-3, 300.0, None if tiered else 600.0, None, str(out))
    assert lines_out[-1] == f"chart: {out}" and out.stat().st_size > 10_000
