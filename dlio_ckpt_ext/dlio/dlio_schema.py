"""DLIO's result files for a checkpoint-only run, in upstream DLIO's schema.

Upstream main's StatsCounter writes them itself; on DLIO 2.0.0, whose
StatsCounter knows no checkpoint-only run, our workflow writes them with this
module, so a tool written for upstream DLIO's results (MLPerf Storage's
results tooling reads summary.json's `metric` fields and `num_hosts`) reads
ours unchanged. As upstream, the "GB" figures are GiB-based.
"""
from __future__ import annotations

import datetime
import os
import platform
import socket

import psutil

from dlio_ckpt_ext.result_files import write_json
from dlio_ckpt_ext.results.windows import mean_std

TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # DLIO's utcnow() format (local time, despite the name)
SUMMARY_FILE = "summary.json"


def timestamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime(TS_FORMAT)


def _lines_to_dict(path: str) -> dict:
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                if ":" in line:
                    k, v = line.split(":", 1)
                    out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def metric_fields(windows: dict[str, list[dict]], checkpoint_gib: float) -> dict:
    """summary.json's `metric`: mean and population std over checkpoints, as upstream."""
    out = {}
    for phase in ("save", "load"):
        w = windows.get(phase) or []
        if not w:
            continue
        io_mean, io_std = mean_std([x["throughput_gib_s"] for x in w])
        d_mean, d_std = mean_std([x["duration_s"] for x in w])
        out[f"{phase}_checkpoint_io_mean_GB_per_second"] = io_mean
        out[f"{phase}_checkpoint_io_stdev_GB_per_second"] = io_std
        out[f"{phase}_checkpoint_duration_mean_seconds"] = d_mean
        out[f"{phase}_checkpoint_duration_stdev_seconds"] = d_std
    out["checkpoint_size_GB"] = checkpoint_gib
    return out


def async_metric_fields(async_summary: dict) -> dict:
    """Async mode's own figures (the save fields stay the persist windows)."""
    out = {}
    for key in ("blocked_s", "staging_s", "wait_s"):
        name = key[:-2]
        out[f"checkpoint_save_{name}_mean_seconds"] = async_summary[key]["mean"]
        out[f"checkpoint_save_{name}_std_seconds"] = async_summary[key]["std"]
    out["checkpoint_persist_kept_up"] = async_summary["kept_up"]
    out["checkpoint_persist_kept_up_of"] = async_summary["judged"]
    return out


def summary(start: float, end: float, ranks: int, num_hosts: int, host_memory_gib: list[float],
            host_cpus: list[int], windows: dict[str, list[dict]], checkpoint_gib: float) -> dict:
    return {"start": timestamp(start), "num_accelerators": ranks, "num_hosts": num_hosts,
            "hostname": socket.gethostname(), "metric": metric_fields(windows, checkpoint_gib),
            "num_files_train": 0, "num_files_eval": 0, "num_samples_per_file": 1,
            "host_cpu_count": host_cpus, "host_processor_name": platform.processor(),
            "potential_caching": [0] * num_hosts,
            "host_cpuinfo": _lines_to_dict("/proc/cpuinfo"), "host_meminfo": _lines_to_dict("/proc/meminfo"),
            "host_memory_GB": host_memory_gib, "data_size_per_host_GB": 0.0, "end": timestamp(end)}


def per_epoch_stats(start: float, end: float, timings: dict[str, list[tuple[float, float]]],
                    checkpoint_gib: float) -> dict:
    """{rank}_per_epoch_stats.json: this rank's own timing of each checkpoint."""
    epoch = {"start": timestamp(start)}
    for phase, key in (("save", "save_ckpt"), ("load", "load_ckpt")):
        for i, (t0, t1) in enumerate(timings.get(phase, []), start=1):
            duration = t1 - t0
            epoch[f"{key}{i}"] = {"start": timestamp(t0), "end": timestamp(t1), "duration": duration,
                                  "throughput": checkpoint_gib / duration if duration > 0 else 0.0}
    epoch["end"] = timestamp(end)
    return {"1": epoch}


def output(start: float, end: float) -> dict:
    """{rank}_output.json: the host's description, as upstream writes it."""
    return {"host_memory_GB": psutil.virtual_memory().total / 2**30, "host_cpu_count": psutil.cpu_count(),
            "host_processor_name": platform.processor(), "potential_caching": 0,
            "host_cpuinfo": _lines_to_dict("/proc/cpuinfo"), "host_meminfo": _lines_to_dict("/proc/meminfo"),
            "1": {"start": timestamp(start), "load": {}, "proc": {}, "throughput": {}, "au": {}, "compute": {},
                  "end": timestamp(end)},
            "hostname": socket.gethostname()}


def write_rank_files(folder: str, rank: int, start: float, end: float,
                     timings: dict[str, list[tuple[float, float]]], checkpoint_gib: float) -> None:
    write_json(os.path.join(folder, f"{rank}_per_epoch_stats.json"),
                       per_epoch_stats(start, end, timings, checkpoint_gib))
    write_json(os.path.join(folder, f"{rank}_output.json"), output(start, end))
