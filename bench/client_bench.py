#!/usr/bin/env python3
"""Client libraries side by side: one preset's rank saved and loaded through each
storage_library (s3dlio, s3torchconnector, minio, msc, tensorstore) on one
SeaweedFS, in one run, optionally behind the emulated remote link.

    python bench/client_bench.py [--libraries s3dlio,msc] [--rounds 3] [--latency-ms 10 --rate-mb-s 40]
                                 [--json bench/results/client_bench.json]

Each measurement is a child process (its own client, its own peak RSS): the
Checkpointer of rank 0 of --ranks saves checkpoint 1 (dgen-py generating as it
writes) and loads it back (verify off), each phase timed, with the process's
CPU seconds (user + system) over it, the requests the library sent by kind
(s3dlio's counted by the server's own counters, which see one client at a time
here), and the process's peak RSS. The libraries run in a rotated order each
round (the machine is noisy); the table gives each library's median and the
ratio to s3dlio's median in the same run. On a 2-core machine the server is
CPU-bound beside the client: use the ratios and the counts, not the absolute
GiB/s.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_servers import seaweedfs  # noqa: E402
from bench_table import BenchTable  # noqa: E402

LIBRARIES = ("s3dlio", "s3torchconnector", "minio", "msc", "tensorstore")
GiB = float(1 << 30)
BUCKET = "ckpt"


def usage() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(args) -> None:
    """One library's save and load of rank 0's files; prints a JSON line."""
    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    from dlio_ckpt_ext.tools.presets import compose_config
    overrides = [f"++workload.model.num_layers={args.layers}", f"++workload.model.transformer.hidden_size={args.hidden}",
                 f"++workload.model.transformer.ffn_hidden_size={args.hidden * 7 // 2}",
                 "++workload.storage.storage_type=s3",
                 f"++workload.storage.storage_root=s3://{BUCKET}/bench-{args.child}-{args.round}",
                 f"++workload.storage.storage_options.storage_library={args.child}",
                 "++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1"]
    cfg = compose_config(args.preset, overrides, args.ranks)
    from dlio_ckpt_ext.storage.libraries import requests
    from dlio_ckpt_ext.tools.local_s3 import LocalS3
    server = LocalS3("", None, Path("."), metrics_url=args.metrics)
    ck = Checkpointer(cfg, 0, args.ranks, 1)
    ck.prepare()
    out = {"library": args.child}
    for phase, action in (("save", lambda: ck.save(1)), ("load", lambda: ck.load(1))):
        served, counted = server.request_counts(), ck.backend.request_counts()
        cpu0, t0 = usage(), time.perf_counter()
        files = action()
        elapsed, cpu = time.perf_counter() - t0, usage() - cpu0
        nbytes = sum(f.nbytes for f in files)
        out[phase] = {"bytes": nbytes, "gib_s": nbytes / GiB / elapsed, "cpu_s_per_gib": cpu / (nbytes / GiB),
                      "requests": requests.since(counted, ck.backend.request_counts()),
                      "server_requests": server_requests(server, served)}
    ck.remove_written([(1, 1)])
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(out), flush=True)


def server_requests(server, before: dict) -> dict:
    """The server's requests since `before`, by its own counters."""
    after = server.request_counts()
    return {k: int(after[k] - before.get(k, 0)) for k in after if after[k] - before.get(k, 0)}


def measure(args, library: str, rnd: int, server) -> dict:
    cmd = [sys.executable, __file__, "--child", library, "--round", str(rnd), "--metrics", server.metrics_url,
           "--preset", args.preset,
           "--ranks", str(args.ranks), "--layers", str(args.layers), "--hidden", str(args.hidden)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if res.returncode or line is None:
        raise SystemExit(f"{library}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def counts(requests: dict | None) -> str:
    short = {"CreateMultipartUpload": "create", "UploadPart": "part", "CompleteMultipartUpload": "complete",
             "AbortMultipartUpload": "abort"}
    return ", ".join(f"{n} {short.get(k, k)}" for k, n in (requests or {}).items()) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libraries", default=",".join(LIBRARIES))
    ap.add_argument("--preset", default="torchtitan_llama3_8b_checkpoint")
    ap.add_argument("--ranks", type=int, default=4, help="the job's ranks (rank 0's files are measured)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="emulated remote link: one-way latency")
    ap.add_argument("--rate-mb-s", type=float, default=0.0, help="emulated remote link: MB/s per connection")
    ap.add_argument("--json", help="also save the table here (bench/results/client_bench.json for the docs)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--metrics", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    libraries = args.libraries.split(",")
    link = f"{args.latency_ms:g}:{args.rate_mb_s:g}" if args.latency_ms or args.rate_mb_s else ""
    data = Path(tempfile.mkdtemp(prefix="client-bench-"))
    server = seaweedfs(data / "seaweedfs", link, BUCKET)
    runs: dict[str, list[dict]] = {lib: [] for lib in libraries}
    try:
        for rnd in range(args.rounds):
            order = libraries[rnd % len(libraries):] + libraries[:rnd % len(libraries)]
            for lib in order:
                runs[lib].append(measure(args, lib, rnd, server))
                r = runs[lib][-1]
                print(f"round {rnd + 1} {lib}: save {r['save']['gib_s']:.3f} GiB/s, load {r['load']['gib_s']:.3f}"
                      f" GiB/s, peak RSS {r['peak_rss_bytes'] / GiB:.2f} GiB", flush=True)
    finally:
        server.stop()
    where = (f"behind the emulated link ({args.latency_ms:g} ms each way, {args.rate_mb_s:g} MB/s a connection)"
             if link else "on loopback")
    first = runs[libraries[0]][0]
    table = BenchTable("client_bench", f"Client libraries, SeaweedFS {where}: rank 0 of {args.ranks} of "
                       f"{args.preset} scaled to {args.layers} layers, hidden {args.hidden} "
                       f"({first['save']['bytes'] / GiB:.2f} GiB a save), median of {args.rounds} rotated rounds",
                       ["library", "save GiB/s", "x s3dlio", "load GiB/s", "x s3dlio", "save requests",
                        "load requests", "client CPU s/GiB save / load", "peak RSS GiB"])
    med = {lib: {p: statistics.median(r[p]["gib_s"] for r in rs) for p in ("save", "load")}
           for lib, rs in runs.items()}
    base = med.get("s3dlio")
    for lib, rs in runs.items():
        cpu = {p: statistics.median(r[p]["cpu_s_per_gib"] for r in rs) for p in ("save", "load")}
        # s3dlio's client does not count its requests: the server's counters (one client at a time here)
        req = {p: rs[0][p]["requests"] or rs[0][p]["server_requests"] for p in ("save", "load")}
        table.add(lib, f"{med[lib]['save']:.3f}", f"{med[lib]['save'] / base['save']:.2f}" if base else "-",
                  f"{med[lib]['load']:.3f}", f"{med[lib]['load'] / base['load']:.2f}" if base else "-",
                  counts(req["save"]), counts(req["load"]),
                  f"{cpu['save']:.2f} / {cpu['load']:.2f}",
                  f"{max(r['peak_rss_bytes'] for r in rs) / GiB:.2f}")
    table.note("Requests: the backend's own tally of the phase for the client libraries (equal to the server's: "
               "tests/test_client_libraries*.py); s3dlio's are the server's counters (PUT, POST, GET by status), "
               "since its client does not count them.")
    beaten = [lib for lib in libraries if base and lib != "s3dlio" and any(
        med[lib][p] > base[p] * 1.05 for p in ("save", "load"))]
    if beaten:
        table.note("Faster than s3dlio here (more than 5 %): " + ", ".join(
            f"{lib} ({', '.join(p for p in ('save', 'load') if med[lib][p] > base[p] * 1.05)})" for lib in beaten))
    table.finish(args.json, {lib: rs for lib, rs in runs.items()})


if __name__ == "__main__":
    main()
