"""RECOVERY: what each recovery cost the job, from every rank's record
(schedules/recovery.py), gathered on rank 0 at the end of the run: its
summary, its lines in RESULTS, and its panel in the run's picture (each
recovery's bytes by source, its discovery and its time to resume)."""
from __future__ import annotations

from dlio_ckpt_ext.engine.profile import GiB


def summarise(gathered: list[list[dict]]) -> list[dict]:
    """gathered[rank][i]: rank's record of recovery i. The decision is the same
    on every rank (rank 0's stands); requests and bytes are summed over the
    ranks; the discovery and the time to resume are the slowest rank's, in
    the global window from the first rank's start."""
    out = []
    for i, first in enumerate(gathered[0]):
        ranks = [g[i] for g in gathered]
        start = min(r["start"] for r in ranks)
        requests: dict[str, int] = {}
        for r in ranks:
            for kind, n in r["requests"].items():
                requests[kind] = requests.get(kind, 0) + n
        out.append({key: first[key] for key in ("tier", "step", "reason", "checkpoint", "skipped", "how",
                                                "lost_ranks")}
                   | {key: first[key] for key in ("saved_ranks", "restore", "saved_shape", "saved_as", "restored_as")
                      if key in first}
                   | {"ranks": len(ranks), "requests": requests,
                      "requests_per_rank_max": max(sum(r["requests"].values()) for r in ranks),
                      "discovery_s": max(r["found_at"] for r in ranks) - start,
                      "time_to_resume_s": max(r["end"] for r in ranks) - start,
                      "start": start, "end": max(r["end"] for r in ranks),
                      "local_bytes": sum(r["local_bytes"] for r in ranks),
                      "moved_bytes": sum(r["moved_bytes"] for r in ranks),
                      "storage_bytes": sum(r["storage_bytes"] for r in ranks),
                      "moved_to": sorted(rank for rank, r in enumerate(ranks) if r["moved_bytes"])})
        if first.get("conversion"):
            out[-1]["conversion"] = first["conversion"]
    return out


def _requests(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "none"


def recovery_lines(summary: list[dict]) -> list[str]:
    lines = ["RECOVERY (each: the newest whole checkpoint found as the framework finds it, then restored; "
             "docs/recovery.md)"]
    for i, r in enumerate(summary, 1):
        what = f"iteration {r['step']}" if r["tier"] == "local" else f"step {r['step']} ({r['checkpoint']})"
        lines += [f"  recovery {i}: {r['tier']} tier, {what}: {r['reason']}",
                  f"    {'finding it':26s} {r['discovery_s']:.4f} s, requests of all {r['ranks']} ranks: "
                  f"{_requests(r['requests'])} (at most {r['requests_per_rank_max']} a rank)",
                  f"    {'bytes':26s} local tier {r['local_bytes']} ({r['local_bytes'] / GiB:.3f} GiB), between "
                  f"ranks {r['moved_bytes']} ({r['moved_bytes'] / GiB:.3f} GiB), storage under test "
                  f"{r['storage_bytes']} ({r['storage_bytes'] / GiB:.3f} GiB)",
                  f"    {'time to resume':26s} {r['time_to_resume_s']:.4f} s (the slowest rank, from the discovery's "
                  "start to its last byte)"]
        if "saved_as" in r:
            lines.append(f"    {'saved by':26s} {r['saved_as']}; restored at {r['restored_as']}")
        if "conversion" in r:
            lines.append(conversion_line(r["conversion"]))
        if r["skipped"]:
            lines.append(f"    {'passed over':26s} {', '.join(r['skipped'])} (half-written)")
        if r["lost_ranks"]:
            lines.append(f"    {'lost ranks':26s} {r['lost_ranks']}; parts received from a peer by "
                         f"{r['moved_to'] or 'none'}")
    return lines


def conversion_line(c: dict) -> str:
    """DeepSpeed's universal conversion (checkpoint/universal.py's summary), one line."""
    return (f"    {'universal conversion':26s} {c['time_s']:.4f} s (extract {c['extract_s']:.4f} s, merge "
            f"{c['merge_s']:.4f} s): read {c['read_files']} files ({c['read_bytes'] / GiB:.3f} GiB), wrote "
            f"{c['written_files']} ({c['written_bytes'] / GiB:.3f} GiB), removed {c['deleted_files']} fragments; "
            f"zero/ holds {c['zero_folders']} folders, one a parameter; the load lists {c['load_listings']}")


# -- its panel in the run's picture (dlio-ckpt-report run) -----------------------

#: where a recovery's bytes came from, bottom first, with their colours
SOURCES = (("local_bytes", "local tier", "tab:orange"), ("moved_bytes", "from peers", "tab:purple"),
           ("storage_bytes", "storage under test", "tab:blue"))


def panel(record: dict, ax) -> None:
    """Each recovery's bytes by where they came from (GiB), labelled with its discovery and
    its time to resume."""
    rows = record["recovery"]
    labels = [f"{i}: {r['tier']} tier\nfound in {r['discovery_s']:.3f} s, resumed in {r['time_to_resume_s']:.3f} s"
              for i, r in enumerate(rows, 1)]
    left = [0.0] * len(rows)
    for key, name, colour in SOURCES:
        widths = [r[key] / GiB for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GiB read to resume")
    ax.set_title("RECOVERY: each recovery's bytes by source, its discovery and its time to resume", fontsize=9)
    ax.legend(fontsize=7)


KEY = "recovery"


def drawn(block: list) -> bool:
    return bool(block)
