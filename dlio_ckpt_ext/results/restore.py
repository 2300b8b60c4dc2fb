"""RESTORE: what a restore's loads read by the layout's plan (Layout.summary),
against the bytes the ranks measured (a model load's plan: results/model_load.py)."""
from __future__ import annotations

from dlio_ckpt_ext.results.model_load import model_load_lines


def restore_lines(plan: dict, windows: list[dict]) -> list[str]:
    """RESULTS' lines on what the loads read (Layout.summary), against the
    bytes the ranks measured: the plan's figures hold only if they agree."""
    if not plan or not windows:
        return []
    # the windows' bytes are what storage served; with sharing the rest came by broadcast
    measured = sorted({w["bytes"] for w in windows})
    agree = measured == [plan["storage_bytes"]]
    received = sorted({w["broadcast_bytes"] for w in windows if "broadcast_bytes" in w})
    saved = (f"a checkpoint saved at {plan['saved_ranks']} ranks, resharded" if plan["saved_ranks"] != plan["ranks"]
             else "the checkpoint saved at the same world size")
    rank_bytes = (f"{plan['rank_bytes_min']}" if plan["rank_bytes_min"] == plan["rank_bytes_max"]
                  else f"{plan['rank_bytes_min']}-{plan['rank_bytes_max']}")
    if plan.get("model_load"):
        return model_load_lines(plan, windows)
    lines = [f"RESTORE (load): restore={plan['pattern']} share={plan['share']}, {plan['ranks']} ranks reading {saved}",
             f"  {'bytes read per load':28s} {plan['bytes_read']} ({plan['amplification']:.3f}x the checkpoint's "
             f"{plan['checkpoint_bytes']} bytes), per rank {rank_bytes}",
             f"  {'from storage / broadcast':28s} {plan['storage_bytes']} / {plan['broadcast_bytes']} bytes"
             + ("" if agree else f"; MEASURED from storage {', '.join(map(str, measured))}")
             + (f"; received by broadcast {', '.join(map(str, received))}, "
                f"{sum(w['broadcast_s'] for w in windows) / len(windows) / plan['ranks']:.3f} s a rank a load"
                if received else ""),
             f"  {'readers per file':28s} max {plan['readers_per_file_max']}, mean {plan['readers_per_file_mean']:.2f} "
             f"({plan['files_read']} of {plan['checkpoint_files']} files read)",
             f"  {'ranged requests per file':28s} max {plan['requests_per_file_max']}, mean "
             f"{plan['requests_per_file_mean']:.2f} (up to {plan['read_size'] / 2**20:g} MiB each)"]
    return lines
