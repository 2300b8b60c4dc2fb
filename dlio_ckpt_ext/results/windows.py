"""What every phase gathers from the ranks: each rank's record of one checkpoint
(files, CPU, requests), the O(1) part of it rank 0 gathers, and the global
window rank 0 makes of them; the window's line as said when every rank
finished it, and the [METRIC] lines.

A checkpoint's duration is the window from the first rank's start to the
last rank's close (MLPerf's definition, not rank 0's own time); its
throughput is the bytes of all ranks over that window, and the reported
figure is the mean (± population std) over checkpoints, as upstream DLIO.
"""
from __future__ import annotations

import statistics

from dlio_ckpt_ext.engine.profile import GiB, FileStats
from dlio_ckpt_ext.storage.libraries import requests
from dlio_ckpt_ext.storage.retries import KEYS as RETRY_KEYS


#: a rank's CPU inside a checkpoint's window (engine/profile.usage_since)
USAGE_KEYS = ("cpu_user_s", "cpu_sys_s", "minor_faults")


def local_record(step: int, files: list[FileStats], start: float, end: float, usage: dict | None = None,
                 retried: dict | None = None, requested: dict | None = None) -> dict:
    """This rank's part of one checkpoint: wall-clock start/end around its files,
    the process's CPU seconds and minor page faults between them, the
    requests its client saw throttled or retried (None: a client that cannot tell),
    and the requests by kind a client library sent (None: s3dlio's, counted by the server)."""
    return {"step": step, "start": start, "end": end, "elapsed_s": end - start,
            "bytes": sum(f.nbytes for f in files), **(usage or dict.fromkeys(USAGE_KEYS, 0)),
            "retries": retried, "requests": requested, "files": [f.to_dict() for f in files]}


#: share=broadcast: what a rank's load received from the other readers, and its seconds
BROADCAST_KEYS = ("broadcast_bytes", "broadcast_s")


def window_part(record: dict, rank: int, host: str, replica: int | None = None) -> dict:
    """What rank 0 needs of a rank's record for the global window: no file or
    chunk detail (gathered from every rank, it must stay O(1) per rank);
    replica: a model load's serving replica the rank belongs to."""
    return {k: record[k] for k in ("step", "start", "end", "elapsed_s", "bytes", *USAGE_KEYS)} | \
        {"retries": record.get("retries"), "requests": record.get("requests")} | \
        {k: record[k] for k in BROADCAST_KEYS if k in record} | {"rank": rank, "host": host} | \
        ({"replica": replica} if replica is not None else {})


def global_window(records_by_rank: list[dict]) -> dict:
    """Combine every rank's record of one checkpoint (window_part) into its
    global window, with its skew: the first and the last rank done, and each
    host's throughput (its ranks' bytes over its first start to its last end),
    so a slow rank or node stands out."""
    start = min(r["start"] for r in records_by_rank)
    end = max(r["end"] for r in records_by_rank)
    nbytes = sum(r["bytes"] for r in records_by_rank)
    duration = end - start
    first = min(records_by_rank, key=lambda r: r["end"])
    last = max(records_by_rank, key=lambda r: r["end"])
    slowest = max(records_by_rank, key=lambda r: r["elapsed_s"])
    hosts: dict[str, list[dict]] = {}
    for r in records_by_rank:
        hosts.setdefault(r.get("host", ""), []).append(r)
    per_host = {}
    for host, recs in sorted(hosts.items()):
        span = max(r["end"] for r in recs) - min(r["start"] for r in recs)
        host_bytes = sum(r["bytes"] for r in recs)
        per_host[host] = {"ranks": len(recs), "bytes": host_bytes, "duration_s": span,
                          "throughput_gib_s": host_bytes / GiB / span if span > 0 else 0.0}
    slow_host = min(per_host, key=lambda h: per_host[h]["throughput_gib_s"])
    replicas = replica_times(records_by_rank) if "replica" in records_by_rank[0] else {}
    return {"step": records_by_rank[0]["step"], "start": start, "end": end, "duration_s": duration,
            "bytes": nbytes, "throughput_gib_s": nbytes / GiB / duration if duration > 0 else 0.0,
            "rank_elapsed_min_s": min(r["elapsed_s"] for r in records_by_rank),
            "rank_elapsed_max_s": slowest["elapsed_s"],
            "first_done_s": first["end"] - start, "first_done_rank": first.get("rank"),
            "last_done_s": duration, "last_done_rank": last.get("rank"), "last_done_host": last.get("host"),
            "spread_s": last["end"] - first["end"],
            "slowest_rank": slowest.get("rank"), "slowest_rank_host": slowest.get("host"),
            "slowest_host": slow_host, "hosts": per_host,
            **{k: sum(r[k] for r in records_by_rank) for k in USAGE_KEYS},
            **{k: sum(r[k] for r in records_by_rank) for k in BROADCAST_KEYS if k in records_by_rank[0]},
            "retries": window_retries(records_by_rank),
            "requests": requests.summed([r.get("requests") for r in records_by_rank]), **replicas}


def window_retries(records_by_rank: list[dict]) -> dict | None:
    """One checkpoint's throttled and retried requests over the ranks, with the
    ranks and hosts that saw throttling; None when no rank's client could count."""
    counted = [r for r in records_by_rank if r.get("retries") is not None]
    if not counted:
        return None
    hosts: dict[str, int] = {}
    for r in counted:
        if r["retries"]["throttled"]:
            hosts[r.get("host", "")] = hosts.get(r.get("host", ""), 0) + r["retries"]["throttled"]
    return {**{k: sum(r["retries"][k] for r in counted) for k in RETRY_KEYS},
            "ranks_counted": len(counted), "ranks": len(records_by_rank),
            "throttled_ranks": sorted(r["rank"] for r in counted if r["retries"]["throttled"]),
            "throttled_hosts": dict(sorted(hosts.items()))}


def listed(values: list, shown: int = 8) -> str:
    """The first `shown` values, and how many in all beyond them."""
    text = ", ".join(map(str, values[:shown]))
    return text if len(values) <= shown else f"{text}, ... ({len(values)} in all)"


def window_line(phase: str, window: dict) -> str:
    """One checkpoint's global window as said when every rank finished it (and again by
    `dlio-ckpt-report status` for a run that broke later)."""
    throttled = (window.get("retries") or {}).get("throttled")
    return (f"checkpoint {phase} {window['step']}, every rank done: {window['duration_s']:.4f} s, "
            f"{window['throughput_gib_s']:.4f} GiB/s ({window['bytes']} bytes, first rank's start to last "
            "rank's end)" + (f"; {throttled} request(s) throttled" if throttled else ""))


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.pstdev(values)


def metric_lines(phase: str, windows: list[dict], label: str = "[METRIC]") -> list[str]:
    """label: "[METRIC]", or another prefix where DLIO prints the [METRIC] lines itself."""
    d_mean, d_std = mean_std([w["duration_s"] for w in windows])
    t_mean, t_std = mean_std([w["throughput_gib_s"] for w in windows])
    return [f"{label} Checkpoint {phase} duration (seconds): {d_mean:.4f} (\u00b1{d_std:.4f})",
            f"{label} Checkpoint {phase} I/O Throughput (GiB/second): {t_mean:.4f} (\u00b1{t_std:.4f})"]



def replica_times(records_by_rank: list[dict]) -> dict:
    """A model load's replicas: each one's time from its first rank's start to
    its last rank holding its weights, and the slowest."""
    replicas: dict[int, list[dict]] = {}
    for r in records_by_rank:
        replicas.setdefault(r["replica"], []).append(r)
    times = {k: max(r["end"] for r in v) - min(r["start"] for r in v) for k, v in sorted(replicas.items())}
    slowest = max(times, key=times.get)
    return {"replica_s": times, "slowest_replica": slowest, "slowest_replica_s": times[slowest]}
