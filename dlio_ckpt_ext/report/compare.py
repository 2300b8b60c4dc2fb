"""Two results side by side (throughput, and the headline figures of every
further block either has: tiers' persist slack, recovery's time to resume,
training's stall, goodput), with every difference that could explain a change."""
from __future__ import annotations

from dlio_ckpt_ext.report.block_figures import block_figures
from dlio_ckpt_ext.report.results import Result, flatten

ENVIRONMENT = ("ranks", "num_hosts", "hosts", "ranks_per_node", "threads", "cache_method",
               "reads_may_be_cached", "storage", "transparent_hugepage")


def _fmt(value: tuple[float, float] | None) -> str:
    return "-" if value is None else f"{value[0]:.4f} (\u00b1{value[1]:.4f})"


def _differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    fa, fb = flatten(a), flatten(b)
    return [(k, fa.get(k, "<absent>"), fb.get(k, "<absent>")) for k in sorted(set(fa) | set(fb))
            if fa.get(k, "<absent>") != fb.get(k, "<absent>")]


def compare(a: Result, b: Result) -> tuple[list[str], int]:
    """Report lines, and how many differences in code, settings or environment were found."""
    lines = [f"A: {a.path}", f"B: {b.path}", "",
             f"{'throughput (GiB/s)':24s} {'A':>22s} {'B':>22s} {'B vs A':>9s}"]
    for phase in ("save", "load"):
        ta, tb = a.throughput(phase), b.throughput(phase)
        change = f"{100 * (tb[0] - ta[0]) / ta[0]:+.1f}%" if ta and tb and ta[0] else "-"
        lines.append(f"{'checkpoint ' + phase:24s} {_fmt(ta):>22s} {_fmt(tb):>22s} {change:>9s}")
    fa, fb = block_figures(a.summary), block_figures(b.summary)
    for key in [k for k in fa if k in fb] + [k for k in fb if k not in fa] + [k for k in fa if k not in fb]:
        va, vb = fa.get(key), fb.get(key)
        change = f"{100 * (vb - va) / va:+.1f}%" if va and vb is not None else "-"
        show = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(f"{key:45s} {show(va):>12s} {show(vb):>12s} {change:>9s}")
    sections = [
        ("versions", _differences(a.summary.get("versions", {}), b.summary.get("versions", {}))
         + _differences({"git_commit": a.summary.get("git_commit")}, {"git_commit": b.summary.get("git_commit")})),
        ("settings", _differences(a.summary.get("config", {}).get("effective", {}),
                                  b.summary.get("config", {}).get("effective", {}))),
        ("environment", _differences({k: a.summary.get(k) for k in ENVIRONMENT},
                                     {k: b.summary.get(k) for k in ENVIRONMENT})),
    ]
    total = 0
    for title, diffs in sections:
        lines += ["", f"{title}: " + (f"{len(diffs)} difference(s)" if diffs else "same")]
        lines += [f"  ! {key}: {va!r} -> {vb!r}" for key, va, vb in diffs]
        total += len(diffs)
    return lines, total
