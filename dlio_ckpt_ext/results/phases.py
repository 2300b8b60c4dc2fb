"""The save and load blocks, RESULTS (save) and RESULTS (load): each phase's
figures (generation against I/O, the client's CPU, its requests, throttling
and retries, slow requests, each checkpoint's skew), their warnings, and their
panels in the run's picture (every rank's rate per file and per chunk, each
checkpoint's throughput, each host's)."""
from __future__ import annotations

from dlio_ckpt_ext.engine.profile import GiB, SLOW_FLOOR_S, SLOW_MULTIPLE
from dlio_ckpt_ext.results.windows import listed
from dlio_ckpt_ext.storage.libraries import requests
from dlio_ckpt_ext.storage.retries import KEYS as RETRY_KEYS


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

# -- their panels in the run's picture (dlio-ckpt-report run) --------------------

PHASE_COLOURS = {"save": "tab:blue", "load": "tab:green"}


def _points(records: list[dict], t0: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]], str]:
    """(time, I/O GiB/s) of every file, and (time, generation GiB/s) of every chunk
    where the run kept them (streaming.record_chunks), else of every file, with the
    generation points' unit. I/O is per file because a chunk's own rate is one
    request's of the many in flight (16 ranged reads, several parts): far below
    the rank's rate and the bars under it; a file's I/O time is wall time with a
    request in flight, so its rate is the rank's."""
    files = [f for rec in records for f in rec["files"]]
    io = [(f["end"] - t0, f["nbytes"] / GiB / (f["io_s"] + f["close_s"])) for f in files
          if f["io_s"] + f["close_s"] > 0]
    chunks = [c for f in files for c in f.get("chunks") or []]
    if chunks:  # [offset, nbytes, fill_s, io_s, wait_free_s, wait_filled_s, done_at, produced_at]
        return io, [(c[6] - t0, c[1] / GiB / c[2]) for c in chunks if c[2] > 0], "chunk"
    return io, [(f["end"] - t0, f["nbytes"] / GiB / f["fill_s"]) for f in files if f["fill_s"] > 0], "file"


def panels(result, timeline, bars, hosts) -> None:
    """The phases' three panels: every rank's I/O rate per file and generation rate per chunk
    on a timeline, each checkpoint's throughput, each host's throughput per checkpoint
    (`result`: report.results.Result, the record with every rank's file)."""
    t0 = result.summary["start_time"]
    unit = "chunk"
    for stats in result.rank_stats:
        for phase, records in stats["phases"].items():
            io, fills, unit = _points(records, t0)
            if io:
                timeline.scatter(*zip(*io), s=6, color=PHASE_COLOURS[phase], alpha=0.6,
                                 label=f"{phase} I/O" if stats["rank"] == 0 else None)
            if fills:
                timeline.scatter(*zip(*fills), s=6, marker="x", color="tab:orange", alpha=0.6,
                                 label=f"{phase} generation" if stats["rank"] == 0 else None)
    timeline.set_yscale("log")
    timeline.set_xlabel("seconds since the run started")
    timeline.set_ylabel(f"GiB/s per rank: I/O per file, generation per {unit} (log)")
    timeline.set_title(f"{result.summary['model']}, {result.summary['ranks']} ranks: each rank's I/O rate per file "
                       f"and generation rate per {unit} (generation far above I/O: the storage is the bottleneck)")
    timeline.legend(loc="upper right", fontsize=8)
    width, x = 0.4, 0
    ticks = []
    for phase in ("save", "load"):
        per = (result.summary.get(phase) or {}).get("per_checkpoint", [])
        xs = [x + i for i in range(len(per))]
        if per:  # the legend names only what is drawn
            bars.bar(xs, [w["throughput_gib_s"] for w in per], width * 2, color=PHASE_COLOURS[phase], label=phase)
        for xi, w in zip(xs, per):
            for host, h in (w.get("hosts") or {}).items():
                slow = host == w.get("slowest_host") and len(w["hosts"]) > 1
                hosts.scatter([xi], [h["throughput_gib_s"]], s=18, color="tab:red" if slow else PHASE_COLOURS[phase])
                if slow:
                    hosts.annotate(host, (xi, h["throughput_gib_s"]), fontsize=7, xytext=(4, -4),
                                   textcoords="offset points")
        ticks += [(xi, f"{phase} {w['step']}") for xi, w in zip(xs, per)]
        x += len(per) + 1
    for ax in (bars, hosts):
        if ticks:
            ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], rotation=45, fontsize=7)
    bars.set_ylabel("GiB/s (all ranks)")
    bars.set_title("throughput per checkpoint")
    bars.legend(fontsize=8)
    hosts.set_ylim(bottom=0)
    hosts.set_ylabel("GiB/s per host")
    hosts.set_title("each host's throughput per checkpoint (its ranks' bytes over its own window; slowest in red)")
