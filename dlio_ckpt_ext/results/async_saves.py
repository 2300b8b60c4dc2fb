"""Async mode's block: each checkpoint's blocked time, its persist, and whether
persisting kept up with the interval (the persist windows are the save
windows, named apart)."""
from __future__ import annotations

from dlio_ckpt_ext.engine.profile import GiB
from dlio_ckpt_ext.results.windows import mean_std


def async_checkpoints(blocked_by_rank: list[list[dict]], persist: list[dict], drain_s: float) -> dict:
    """Async mode, rank 0: each checkpoint's blocked time (the slowest rank's:
    training resumes only when every rank has), its persist window, and whether
    persisting kept up (the next save found it finished on every rank). The
    last checkpoint has no next save: drain_s is what the end of the run
    waited for it."""
    rows = []
    for i, per_rank in enumerate(zip(*blocked_by_rank)):
        row = {"step": per_rank[0]["step"],
               **{k: max(r[k] for r in per_rank) for k in ("blocked_s", "staging_s", "wait_s", "call_s", "fill_s")},
               "waited": any(r["waited"] for r in per_rank),
               "staging_gib_s": sum(r["bytes"] for r in per_rank) / GiB / max(r["staging_s"] for r in per_rank)
               if any(r["staging_s"] for r in per_rank) else 0.0}
        if i < len(persist):
            row.update(persist_s=persist[i]["duration_s"], persist_gib_s=persist[i]["throughput_gib_s"])
        rows.append(row)
    for row, nxt in zip(rows, rows[1:] + [None]):
        row["kept_up"] = None if nxt is None else not nxt["waited"]
    judged = [r["kept_up"] for r in rows if r["kept_up"] is not None]

    def stat(key: str) -> dict:
        mean, std = mean_std([r[key] for r in rows])
        return {"mean": mean, "std": std}
    return {"per_checkpoint": rows, "blocked_s": stat("blocked_s"), "staging_s": stat("staging_s"),
            "wait_s": stat("wait_s"), "staging_gib_s": stat("staging_gib_s"),
            "kept_up": sum(judged), "judged": len(judged), "final_drain_s": drain_s}


def async_lines(summary: dict, interval: float) -> list[str]:
    def metric(name: str, key: str, unit: str = "seconds") -> str:
        return (f"[METRIC] Checkpoint {name} ({unit}): {summary[key]['mean']:.4f} "
                f"(\u00b1{summary[key]['std']:.4f})")
    lines = [metric("save blocked duration", "blocked_s"),
             metric("save blocked staging", "staging_s"),
             metric("save blocked waiting for the previous persist", "wait_s"),
             metric("staging throughput", "staging_gib_s", "GiB/second")]
    for r in summary["per_checkpoint"]:
        kept = {None: "last checkpoint", True: "yes", False: "no"}[r["kept_up"]]
        lines.append(f"[INFO] async checkpoint {r['step']}: blocked {r['blocked_s']:.4f} s (staging "
                     f"{r['staging_s']:.4f} s, waiting for the previous persist {r['wait_s']:.4f} s), persist "
                     f"{r.get('persist_s', 0.0):.4f} s at {r.get('persist_gib_s', 0.0):.4f} GiB/s, "
                     f"kept up: {kept}")
    lines.append(f"[INFO] persisting kept up with the {interval:g} s interval for {summary['kept_up']} of "
                 f"{summary['judged']} checkpoints (the next save found it finished); the last one was waited "
                 f"for {summary['final_drain_s']:.4f} s at the end")
    return lines
