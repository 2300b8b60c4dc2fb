"""Global checkpoint windows, DLIO-style [METRIC] lines and summary.json.

A checkpoint's duration is the window from the first rank's start to the
last rank's close (MLPerf's definition, not rank 0's own time); its
throughput is the bytes of all ranks over that window, and the reported
figure is the mean (± population std) over checkpoints, as upstream DLIO.
"""
from __future__ import annotations

import json
import os
import statistics

from dlio_ckpt_ext.engine.profile import GiB, SLOW_FLOOR_S, SLOW_MULTIPLE, FileStats
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


def replica_times(records_by_rank: list[dict]) -> dict:
    """A model load's replicas: each one's time from its first rank's start to
    its last rank holding its weights, and the slowest."""
    replicas: dict[int, list[dict]] = {}
    for r in records_by_rank:
        replicas.setdefault(r["replica"], []).append(r)
    times = {k: max(r["end"] for r in v) - min(r["start"] for r in v) for k, v in sorted(replicas.items())}
    slowest = max(times, key=times.get)
    return {"replica_s": times, "slowest_replica": slowest, "slowest_replica_s": times[slowest]}


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


def phase_retries(windows: list[dict]) -> dict | None:
    """A phase's windows' counts summed (None when none could count)."""
    counted = [w["retries"] for w in windows if w.get("retries") is not None]
    if not counted:
        return None
    hosts: dict[str, int] = {}
    for c in counted:
        for host, n in c["throttled_hosts"].items():
            hosts[host] = hosts.get(host, 0) + n
    return {**{k: sum(c[k] for c in counted) for k in RETRY_KEYS},
            "ranks_counted": min(c["ranks_counted"] for c in counted), "ranks": max(c["ranks"] for c in counted),
            "throttled_ranks": sorted({r for c in counted for r in c["throttled_ranks"]}),
            "throttled_hosts": dict(sorted(hosts.items())),
            "throttled_steps": [w["step"] for w in windows if (w.get("retries") or {}).get("throttled")]}


def request_lines(windows: list[dict], storage: dict) -> list[str]:
    """RESULTS' line, where a client library other than s3dlio moved the bytes: its requests by kind
    over every rank and window of the phase, and the library with its settings."""
    counted = requests.summed([w.get("requests") for w in windows])
    if counted is None and "library_version" not in storage:
        return []
    settings = ", ".join(f"{k} {v >> 20} MiB" if k.endswith("size") or k.endswith("threshold") else f"{k} {v}"
                         for k, v in storage.items() if k in LIBRARY_SETTINGS)
    # on gs:// the SDK's bookkeeping is not counted by kind: no requests line there
    return [f"  {'client library':28s} {storage['storage_library']} {storage['library_version']} ({settings})"] + (
        [f"  {'requests (all ranks)':28s} " + (", ".join(f"{k} {n}" for k, n in counted.items()) or "none")]
        if counted is not None else [])


#: a client library's settings worth a word in RESULTS (storage/libraries/*.py settings())
LIBRARY_SETTINGS = ("part_size", "multipart_threshold", "parallel_uploads", "max_concurrency", "files_at_once",
                    "s3_request_concurrency", "gcs_request_concurrency", "holds_whole_files", "single_put_per_file")


def listed(values: list, shown: int = 8) -> str:
    """The first `shown` values, and how many in all beyond them."""
    text = ", ".join(map(str, values[:shown]))
    return text if len(values) <= shown else f"{text}, ... ({len(values)} in all)"


def _throttled_where(c: dict) -> str:
    hosts = list(c["throttled_hosts"].items())
    return (f"on rank(s) {listed(c['throttled_ranks'])}; host(s) "
            + listed([f"{h} {n}" for h, n in sorted(hosts, key=lambda kv: -kv[1])], 4))


def retry_lines(c: dict | None) -> list[str]:
    """RESULTS' line: what every rank's client said of throttling and retries."""
    if c is None:
        return []
    head = f"  {'throttled requests':28s} {c['throttled']} (retried {c['retried']}, gave up {c['gave_up']}"
    if c["ranks_counted"] < c["ranks"]:
        head += f"; counted on {c['ranks_counted']} of {c['ranks']} ranks"
    if not c["throttled"]:
        return [head + ")"]
    return [head + f") {_throttled_where(c)}; in checkpoint(s) {listed(c['throttled_steps'])}"]


def throttle_warnings(phase: str, windows: list[dict]) -> list[str]:
    """A checkpoint whose window holds throttling: its figure is the store's admission control's too."""
    return [f"[WARNING] checkpoint {phase} {w['step']}: {w['retries']['throttled']} request(s) throttled "
            f"{_throttled_where(w['retries'])}: this checkpoint's figure measures the store's admission control "
            "as much as its bandwidth" for w in windows if (w.get("retries") or {}).get("throttled")]


def client_cpu(windows: list[dict], node_cpus: int) -> dict:
    """Every rank's CPU inside a phase's windows per GiB moved (generation
    included on saves), and what it would cost a node: at 10 GiB/s, and at the
    rate each host measured here (the median host's), against its CPUs."""
    gib = sum(w["bytes"] for w in windows) / GiB
    if gib <= 0:
        return {}
    user, sys_ = (sum(w[k] for w in windows) / gib for k in ("cpu_user_s", "cpu_sys_s"))
    rates = sorted(h["throughput_gib_s"] for w in windows for h in (w.get("hosts") or {}).values())
    node_rate = rates[len(rates) // 2] if rates else 0.0
    per_gib = user + sys_
    return {"cpu_s_per_gib": per_gib, "user_s_per_gib": user, "sys_s_per_gib": sys_,
            "minor_faults_per_gib": sum(w["minor_faults"] for w in windows) / gib,
            "cores_at_10_gib_s": per_gib * 10, "node_gib_s": node_rate, "cores_at_node_rate": per_gib * node_rate,
            "node_cpus": node_cpus}


#: the share of a node's CPUs the client may spend at the measured rate before its
#: figure may be the client's rather than the storage's
CLIENT_CPU_SHARE_WARNING = 0.5


def client_cpu_lines(phase: str, cpu: dict) -> list[str]:
    if not cpu:
        return []
    return [f"  {'client CPU':28s} {cpu['cpu_s_per_gib']:.3f} core-seconds per GiB (user "
            f"{cpu['user_s_per_gib']:.3f}, sys {cpu['sys_s_per_gib']:.3f}; {cpu['minor_faults_per_gib']:,.0f} minor "
            f"page faults per GiB): a node moving 10 GiB/s would spend {cpu['cores_at_10_gib_s']:.1f} cores; at "
            f"this run's {cpu['node_gib_s']:.3f} GiB/s per node, {cpu['cores_at_node_rate']:.2f} of its "
            f"{cpu['node_cpus']}"]


def client_cpu_warning(phase: str, cpu: dict) -> list[str]:
    if not cpu or cpu["cores_at_node_rate"] <= CLIENT_CPU_SHARE_WARNING * cpu["node_cpus"]:
        return []
    return [f"[WARNING] the client's own CPU may set the {phase} figure: {cpu['cpu_s_per_gib']:.3f} core-seconds "
            f"per GiB at the measured {cpu['node_gib_s']:.3f} GiB/s per node is {cpu['cores_at_node_rate']:.2f} of "
            f"the node's {cpu['node_cpus']} CPUs"]


def slow_requests(per_rank: list[dict]) -> dict:
    """Every rank's slow-request count of a phase (engine/profile.slow_requests) summed,
    with the slowest request's rank."""
    worst = max(range(len(per_rank)), key=lambda r: per_rank[r]["worst_s"])
    return {"requests": sum(p["requests"] for p in per_rank), "slow": sum(p["slow"] for p in per_rank),
            "ranks_with_slow": sum(1 for p in per_rank if p["slow"]), "multiple": SLOW_MULTIPLE,
            "floor_s": SLOW_FLOOR_S, "worst_s": per_rank[worst]["worst_s"], "worst_rank": worst,
            "worst_file": per_rank[worst]["worst_file"], "worst_rank_median_s": per_rank[worst]["median_s"]}


def slow_request_lines(slow: dict, retries_counted: bool = False) -> list[str]:
    if not slow.get("slow"):
        return []
    why = ("retries (counted above), dropped connections or a stalled server" if retries_counted else
           "retries, dropped connections or a stalled server: this client does not report its retries")
    return [f"  {'slow requests':28s} {slow['slow']} of {slow['requests']} over {slow['multiple']:g}x their rank's "
            f"median and {slow['floor_s']:g} s ({why}); slowest {slow['worst_s']:.2f} s (rank {slow['worst_rank']}, "
            f"{slow['worst_file']}, its median {slow['worst_rank_median_s']:.3f} s)"]


def stall_warnings(stalls: list[dict], shown: int = 8) -> list[str]:
    """One warning per stall (rank, phase, checkpoint, how long, which file), the first few."""
    out = [f"[WARNING] rank {s['rank']}'s {s['phase']} of checkpoint {s['step']} stalled for {s['duration_s']:.1f} s: "
           f"no request completed ({s['file']}); that checkpoint's figure holds the stall" for s in stalls[:shown]]
    if len(stalls) > shown:
        out.append(f"[WARNING] ... and {len(stalls) - shown} more stalls (all in the record's stalls)")
    return out


def skew_lines(phase: str, windows: list[dict], stalls: list[dict] = ()) -> list[str]:
    """RESULTS' lines on skew: each checkpoint's first and last rank done and its
    slowest host (with several hosts, the fastest beside it), and its stalls."""
    lines = []
    for w in windows:
        hosts = w.get("hosts") or {}
        label = f"{phase} {w['step']}: first / last done"
        line = (f"  {label:28s} {w['first_done_s']:.3f} s (rank "
                f"{w['first_done_rank']}) / {w['last_done_s']:.3f} s (rank {w['last_done_rank']} on "
                f"{w['last_done_host']}), spread {w['spread_s']:.3f} s")
        if len(hosts) > 1:
            fast = max(hosts, key=lambda h: hosts[h]["throughput_gib_s"])
            line += (f"; slowest host {w['slowest_host']} {hosts[w['slowest_host']]['throughput_gib_s']:.3f} "
                     f"GiB/s, fastest {fast} {hosts[fast]['throughput_gib_s']:.3f} GiB/s ({len(hosts)} hosts)")
        held = [s for s in stalls if s["phase"] == phase and s["step"] == w["step"]]
        if held:
            worst = max(held, key=lambda s: s["duration_s"])
            line += f"; STALLED {worst['duration_s']:.1f} s (rank {worst['rank']}{f', {len(held)} stalls' if len(held) > 1 else ''})"
        lines.append(line)
    return lines


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


#: what each model-load pattern emulates, for the results
LOADERS = {"safetensors": "vLLM's default loader (safetensors, mmap)", "runai": "runai-model-streamer",
           "fastsafetensors": "fastsafetensors (file per rank, broadcast)"}


def model_load_lines(plan: dict, windows: list[dict]) -> list[str]:
    """RESULTS' lines a platform team reads of a model load: cold start, the
    replicas' times, bytes delivered and from storage against the model's."""
    replicas = len(windows[0].get("replica_s", {})) or 1
    cold, cold_std = mean_std([w["duration_s"] for w in windows])
    slow = max(windows, key=lambda w: w.get("slowest_replica_s", 0))
    delivered = plan["bytes_read"]
    rate = mean_std([delivered / GiB / w["duration_s"] for w in windows if w["duration_s"] > 0])[0]
    measured = sorted({w["bytes"] for w in windows})
    return [f"MODEL LOAD: pattern={plan['pattern']} ({LOADERS.get(plan['pattern'], plan['pattern'])}), "
            f"{replicas} replica(s) of {plan['ranks'] // replicas} rank(s)",
            f"  {'cold start':28s} {cold:.4f} s (\u00b1{cold_std:.4f}): first rank's start to the last replica "
            f"holding its weights; slowest replica {slow.get('slowest_replica', 0)} "
            f"({slow.get('slowest_replica_s', slow['duration_s']):.4f} s, load {slow['step']})",
            f"  {'delivered':28s} {rate:.4f} GiB/s ({delivered} bytes a load into the ranks)",
            f"  {'from storage':28s} {plan['storage_bytes']} bytes a load, {plan['storage_amplification']:.3f}x the "
            f"model's {plan['checkpoint_bytes']}" + ("" if measured == [plan["storage_bytes"]]
                                                     else f"; MEASURED {', '.join(map(str, measured))}")
            + (f"; {plan['broadcast_bytes']} by broadcast" if plan["broadcast_bytes"] else ""),
            f"  {'readers per file':28s} from storage max {plan['storage_readers_per_file_max']}, mean "
            f"{plan['storage_readers_per_file_mean']:.2f} ({plan['files_read']} of {plan['checkpoint_files']} "
            f"files read; {plan['storage_requests']} requests of up to {plan['read_size'] / 2**20:g} MiB)"]


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


def results_block(phase: str, report: dict, cache_method: str = "", concurrency: dict | None = None,
                  durability: str = "") -> list[str]:
    if not report:
        return []
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    gen_name = "generation (fill)" if phase == "save" else "verification (regenerate)"
    # a load without verify generates nothing: no generation figure to give
    generated = [f"  {gen_name:28s} {fmt(report['generation_gib_s_per_rank'], '.3f')} GiB/s per rank "
                 f"({report['fill_s']:.3f} s)"] if report["fill_s"] > 0 else []
    ratio = [f"  {'generation / I/O ratio':28s} {fmt(report['generation_to_io_ratio'], '.2f')}x"] \
        if report["generation_to_io_ratio"] else []
    return [f"RESULTS ({phase}):", *generated,
            f"  {'I/O':28s} {fmt(report['io_gib_s_per_rank'], '.3f')} GiB/s per rank ({report['io_s']:.3f} s, "
            f"of which close/fsync/upload completion {report['close_s']:.3f} s)", *ratio,
            f"  {'pipeline overhead':28s} {report['pipeline_overhead_pct']:.2f} %",
            f"  {'bottleneck':28s} {report['bottleneck']} (I/O-bound chunks: {report['chunks_io_bound']}, "
            f"generation-bound chunks: {report['chunks_fill_bound']})"] + (
            [f"  {'page cache':28s} {cache_method}"] if cache_method else []) + (
            [f"  {'durability':28s} {durability}"] if durability else []) + (
            [f"  {'requests in flight':28s} {concurrency['requests_in_flight']} x "
             + (f"{concurrency['request_bytes'] / 2**20:g} MiB" if concurrency["request_bytes"] else "a whole file")
             + " per rank"
             + (f" ({concurrency['files_at_once']} files at once)" if "files_at_once" in concurrency else "")]
            if concurrency else [])


def write_json(path: str, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    os.replace(tmp, path)


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
