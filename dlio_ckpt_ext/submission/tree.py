"""The folder tree of an MLPerf Storage checkpointing submission, as MLCommons'
submission checker and report generator read it (mlcommons/storage,
mlpstorage 3.0.26):

    <results>/<closed|open>/<org>/results/<system>/checkpointing/<model>/<YYYYMMDD_HHmmss>/

one timestamp folder per DLIO invocation, holding DLIO's files, hydra's record
in dlio_config/, the invocation's console output with `df` of the checkpoint
and results folders, and one metadata file; results.json in the model folder;
systems/<system>.yaml beside results/. This module names and writes those
files; submit.py runs the invocations.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

#: our presets -> MLCommons' model folder names (the checker's 2.1.21)
MODEL_FOLDERS = {"llama3_8b": "llama3-8b", "llama3_70b": "llama3-70b", "llama3_405b": "llama3-405b",
                 "llama3_1t": "llama3-1t"}
PRESET_SUFFIX = "_checkpoint"
STAMP_FORMAT = "%Y%m%d_%H%M%S"
HYDRA_SUBDIR = "dlio_config"
STDOUT_LOG, STDERR_LOG = "checkpointing_run.stdout.log", "checkpointing_run.stderr.log"
RESULTS_FILE = "results.json"
DIVISIONS = ("closed", "open")
#: marks what the submitter must fill in a generated system description
PLACEHOLDER = "FILL IN"


def preset_for_model(model: str) -> Optional[str]:
    """mlpstorage's --model name (llama3-8b) -> our preset (llama3_8b_checkpoint)."""
    for name, folder in MODEL_FOLDERS.items():
        if folder == model:
            return name + PRESET_SUFFIX
    return None


def model_folder_name(model_name: str) -> str:
    """The model folder for a run of model.name `model_name` (non-MLPerf models keep their name)."""
    return MODEL_FOLDERS.get(model_name, model_name.replace("_", "-"))


def model_folder(root: Path, division: str, org: str, system: str, model_name: str) -> Path:
    return root / division / org / "results" / system / "checkpointing" / model_folder_name(model_name)


def new_invocation_folder(folder: Path) -> tuple[Path, datetime.datetime]:
    """A fresh <YYYYMMDD_HHmmss> folder below `folder`, named by the local time
    now (as mlpstorage names them); a second invocation in the same second
    waits for the next one."""
    while True:
        now = datetime.datetime.now()
        path = folder / now.strftime(STAMP_FORMAT)
        try:
            path.mkdir(parents=True)
            return path, now
        except FileExistsError:
            time.sleep(1.05 - now.microsecond / 1e6)


def hydra_overrides(folder: Path) -> list[str]:
    """DLIO's run directory = the invocation folder, hydra's record in dlio_config/."""
    return [f"hydra.run.dir={folder}", f"hydra.output_subdir={HYDRA_SUBDIR}"]


def df_block(paths: list[str]) -> str:
    """`df` of the folders in its standard format (the checker's 4.4.2 reads it from
    the stdout log to tell whether checkpoints and results share a file system)."""
    existing = [p for p in dict.fromkeys(paths) if os.path.exists(p)]
    res = subprocess.run(["df", *existing], capture_output=True, text=True)
    return res.stdout if res.returncode == 0 else f"df failed: {res.stderr.strip()}\n"


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).isoformat()


def metadata(*, model: str, command: str, start: float, end: float, num_processes: int, division: str,
             parameters: dict, override_parameters: dict, args: dict, metrics: dict,
             hosts: list[str], accelerator: Optional[str], exit_status: int, **declared: Any) -> dict:
    """What the checker (args.*, verification, accelerator, invocation times,
    parameters, override_parameters, provenance_file) and the report generator
    (benchmark_type, model, command, run_datetime, num_processes, parameters,
    metrics) read from a run's metadata file."""
    return {"benchmark_type": "checkpointing", "model": model, "command": command,
            "run_datetime": datetime.datetime.fromtimestamp(start).strftime(STAMP_FORMAT),
            "end_datetime": datetime.datetime.fromtimestamp(end).strftime(STAMP_FORMAT),
            "start": iso(start), "end": iso(end),
            # rules 4.7.1: the failover gap is the read's start minus the write's end
            "invocation_start_time": iso(start), "invocation_end_time": iso(end),
            "num_processes": num_processes,
            # lower case: the checker compares lower case, and "CLOSED" skips its CLOSED rules
            "verification": division.lower(), "accelerator": accelerator, "exit_status": exit_status,
            "parameters": parameters, "override_parameters": override_parameters, "args": args,
            "metrics": metrics, "hosts": hosts, "generator": "dlio-ckpt-submit", **declared}


def metadata_path(folder: Path) -> Path:
    """checkpointing_<YYYYMMDD_HHmmss>_metadata.json: the only file of the
    folder whose name contains "metadata" (the checker takes the first one)."""
    return folder / f"checkpointing_{folder.name}_metadata.json"


RESULTS_SENTINEL = "mlperf-results.yaml"


def mark_results_dir(root: Path, org: str) -> None:
    """The file `mlpstorage init` leaves in a results directory, which its report
    generator requires; written once, naming the organisation."""
    path = root / RESULTS_SENTINEL
    if not path.exists():
        from importlib import metadata as md
        version = md.version("dlio-ckpt-ext")
        path.write_text(f"mlperf_results_version: 1\norgname: {org}\n"
                        f"initialized_at: '{datetime.datetime.now(datetime.timezone.utc).isoformat()}'\n"
                        f"initialized_by: dlio-ckpt-submit {version}\n")


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def _os_release() -> tuple[str, str]:
    fields = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            fields[key] = value.strip().strip('"')
    except OSError:
        pass
    return fields.get("NAME") or platform.system(), fields.get("VERSION_ID") or platform.release()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or PLACEHOLDER


def _sockets() -> Optional[int]:
    try:
        ids = {line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("physical id")}
    except OSError:
        return None
    return len(ids) or None


def system_yaml(system: str, hosts: list[str], memory_gib: int, cpus: int) -> str:
    """A skeleton systems/<system>.yaml in the checker's schema: the clients
    as measured here (count, CPU model, sockets, cores, memory, OS), every
    other value a quoted "FILL IN: ..." placeholder that the schema refuses
    until the submitter replaces it."""
    os_name, os_version = _os_release()
    sockets = _sockets()

    def todo(what: str) -> str:
        return f'"{PLACEHOLDER}: {what}"'

    return f"""# Generated by dlio-ckpt-submit system-yaml for {len(hosts)} client host(s): {', '.join(hosts)}.
# Measured on this host: the client CPU, cores, memory and OS. Replace every
# "{PLACEHOLDER}" with the real value (mlcommons/storage system_description/schema.yaml).
system_under_test:
    solution:
        submission_name: {system}
        friendly_description: {todo("the storage solution, in a sentence")}
        architecture:
            storage_location: {todo("remote | local | remote_and_local")}
            benchmark_API: {todo("file | object (what the benchmark used: local_fs/direct_fs or s3)")}
            product_API: {todo("file | object | block")}
            client_footprint: {todo("open_source | closed_source | n/a")}
            client_installation: {todo("in_box | installable | n/a")}
        capabilities:
            multi_host: {todo("true | false")}
            simultaneous_write: {todo("true | false")}
            simultaneous_read: {todo("true | false")}
            remap_time_in_seconds: {todo("seconds from writing to reading (int)")}
    deployment: {todo("onprem | cloud")}
    # onprem: the storage nodes and switches with their rack units and power
    # (product_nodes, product_switches), and their rack units summed here
    total_rack_units: {todo("sum of the storage nodes' and switches' rack units (int); delete for cloud")}
    clients:
        - friendly_description: benchmark client
          quantity: {len(hosts)}
          chassis:
             model_name: {todo("chassis or cloud instance type")}
             rack_units: {todo("rack units per client (int); delete this line for a cloud deployment")}
             power:  # delete this block for a cloud deployment
                min_psus_active: {todo("power supplies needed (int)")}
                psus_configured:
                    - unit_count: {todo("power supplies per client (int)")}
                      inlet_voltage: {todo("volts (int)")}
                      nameplate_power_watts: {todo("watts (int)")}
                      efficiency: {todo("Standard | Bronze | Silver | Gold | Platinum | Titanium | Ruby | Unrated")}
             cpu_model: "{_cpu_model()}"
             cpu_qty: {sockets if sockets else todo("sockets (int)")}
             cpu_cores: {cpus}
             memory_capacity: {memory_gib}
          operating_system:
              name: "{os_name}"
              version: "{os_version}"
"""
