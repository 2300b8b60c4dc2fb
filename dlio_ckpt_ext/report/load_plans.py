"""dlio-ckpt-report plan: what a load would read, for any preset, pattern and
rank count, computed from the plans alone (nothing runs, nothing is read)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from dlio_ckpt_ext.config import RunConfig

GiB = 1 << 30


def plan_summary(cfg: RunConfig, ranks: int) -> dict:
    """The load plan's counts for this config at `ranks` ranks (Layout.summary)."""
    job = cfg.load_job(ranks)
    return {**cfg.layout.summary(cfg.shape, cfg.parallelism, job, cfg.read_size, cfg.checkpoint.share),
            "layout_facts": cfg.layout.facts(cfg.shape, cfg.parallelism, job.saved_ranks)}


def _rank_classes(per_rank: list[dict]) -> list[tuple[list[int], dict]]:
    """Ranks grouped by identical counts, in rank order of each group's first."""
    groups: dict[tuple, list[int]] = {}
    for r in per_rank:
        groups.setdefault((r["bytes"], r["requests"], r["ranges"]), []).append(r["rank"])
    return [(ranks, dict(zip(("bytes", "requests", "ranges"), key))) for key, ranks in groups.items()]


def _span(ranks: list[int]) -> str:
    """0-3,8-11 for [0,1,2,3,8,9,10,11], at most a few runs shown."""
    runs, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(runs[:4]) + (f",... ({len(ranks)} ranks)" if len(runs) > 4 else "")


def plan_lines(s: dict, storage_type: str = "") -> list[str]:
    """The plan as a person reads it: one line a figure, then a line per class of ranks."""
    gib = lambda n: f"{n / GiB:.3f} GiB"  # noqa: E731
    saved = f"saved at {s['saved_ranks']} ranks" + (", resharded" if s["saved_ranks"] != s["ranks"] else "")
    read_kind = "ranged GETs" if storage_type == "s3" else "read requests"
    what = (f"model load: pattern={s['pattern']}" if s.get("model_load")
            else f"load plan: restore={s['pattern']} share={s['share']} layout={s['layout']}")
    lines = [f"{what}, {s['ranks']} ranks, {saved}",
             f"  checkpoint           {s['checkpoint_bytes']} bytes ({gib(s['checkpoint_bytes'])}) in "
             f"{s['checkpoint_files']} files",
             *(f"  layout               {fact}" for fact in s.get("layout_facts", ())),
             f"  bytes read           {s['bytes_read']} ({gib(s['bytes_read'])}), "
             f"{s['amplification']:.3f}x the checkpoint",
             f"  from storage         {s['storage_bytes']} ({gib(s['storage_bytes'])}), "
             f"{s['storage_amplification']:.3f}x; by broadcast {s['broadcast_bytes']}",
             f"  requests             {s['storage_requests']} {read_kind} of up to {s['read_size'] >> 20} MiB from "
             f"storage ({s['requests']} ranges' pieces in all)",
             f"  fan-in               readers per file max {s['readers_per_file_max']}, mean "
             f"{s['readers_per_file_mean']:.2f}; from storage max {s['storage_readers_per_file_max']}, mean "
             f"{s['storage_readers_per_file_mean']:.2f}; {s['files_read']} files read, {s['files_unread']} unread",
             f"  requests per file    max {s['requests_per_file_max']}, mean {s['requests_per_file_mean']:.2f}",
             "  per rank:"]
    for ranks, c in _rank_classes(s["per_rank"]):
        lines.append(f"    ranks {_span(ranks)}: {c['ranges']} ranges, {c['bytes']} bytes ({gib(c['bytes'])}), "
                     f"{c['requests']} {read_kind}")
    return lines


def plan_command(workload: str, ranks: int, overrides: list[str], json_path: Optional[str] = None,
                 ranks_per_node: int = 8) -> list[str]:
    """Compose the preset as dlio_benchmark would, plan its load at `ranks` ranks
    (a tiered run's saves instead, ranks_per_node a node: it loads nothing)."""
    from dlio_ckpt_ext.tools.presets import compose_config
    if any(o.lstrip("+").startswith("workload.tiers.local_root=") for o in overrides):
        from dlio_ckpt_ext.report.tier_plans import tier_lines, tier_summary
        tiers = {"workload": workload, "overrides": overrides,
                 **tier_summary(compose_config(workload, ["++workload.checkpoint.num_checkpoints_read=0",
                                                           *overrides], ranks), ranks, ranks_per_node)}
        if json_path:
            Path(json_path).write_text(json.dumps(tiers, indent=1))
        return tier_lines(tiers)
    # a plan is of a load: a checkpoint saved at another world size is only read
    # by a run that writes none (the user's own overrides still come after)
    cfg = compose_config(workload, ["++workload.checkpoint.num_checkpoints_write=0",
                                    "++workload.checkpoint.num_checkpoints_read=1", *overrides], ranks)
    summary = {"workload": workload, "overrides": overrides, **plan_summary(cfg, ranks)}
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=1))
    return plan_lines(summary, cfg.storage.storage_type)
