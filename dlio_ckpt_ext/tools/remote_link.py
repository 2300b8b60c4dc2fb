"""An emulated remote link: a loopback TCP proxy that adds latency and caps
each connection's bandwidth, so a local S3 server behaves like a remote one.

Real object stores answer after tens of ms and serve each connection at
50-200 MB/s; loopback has neither, so on loopback one request at a time looks
as good as many. Every byte crossing the proxy is delayed by `latency_ms` in
each direction (pipelined: the delay does not cut throughput by itself), and
each connection's direction is paced to `rate_mb_s` (MB = 10^6 bytes). The
kernel's `tc netem` would do the same, where it is available.

    python -m dlio_ckpt_ext.tools.remote_link --target 127.0.0.1:8333 --latency-ms 10 --rate-mb-s 40
    (prints the address it listens on, then serves until killed)

Loopback only: it listens on and connects to 127.0.0.1 addresses alone.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

LOOPBACK = "127.0.0.1"
READ_SIZE = 256 << 10


@dataclass(frozen=True)
class LinkSpec:
    latency_ms: float = 0.0    # one way
    rate_mb_s: float = 0.0     # per connection and direction; 0 = unlimited

    def __str__(self) -> str:
        rate = f"{self.rate_mb_s:g} MB/s" if self.rate_mb_s else "unlimited"
        return f"{self.latency_ms:g} ms each way, {rate} per connection"

    @property
    def active(self) -> bool:
        return self.latency_ms > 0 or self.rate_mb_s > 0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, spec: LinkSpec) -> None:
    loop = asyncio.get_running_loop()
    delay = spec.latency_ms / 1000.0
    rate = spec.rate_mb_s * 1e6
    # room for one bandwidth-delay product: beyond it the sender is held back
    # through TCP, as on a real link, instead of queueing here without bound
    depth = 4 + (math.ceil(rate * delay / READ_SIZE) if rate else 64)
    queue: asyncio.Queue = asyncio.Queue(maxsize=depth)

    async def receive() -> None:
        try:
            while True:
                data = await reader.read(READ_SIZE)
                await queue.put((loop.time() + delay, data))
                if not data:
                    return
        except (ConnectionError, asyncio.CancelledError):
            await queue.put((loop.time(), b""))

    async def send() -> None:
        free_at = loop.time()
        try:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                start = max(due, free_at)
                if rate:
                    free_at = start + len(data) / rate
                    start = free_at  # paced: the last byte leaves at the link's rate
                wait = start - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    await asyncio.gather(receive(), send())


async def _serve(listen_port: int, target: tuple[str, int], spec: LinkSpec, ready) -> None:
    async def handle(client_r, client_w) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, spec), _pipe(server_r, client_w, spec),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, LOOPBACK, listen_port, limit=READ_SIZE * 2)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _parse_target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in (LOOPBACK, "localhost"):
        raise SystemExit(f"remote_link: target {text}: loopback addresses only ({LOOPBACK})")
    return LOOPBACK, int(port)


@dataclass
class RunningLink:
    port: int
    proc: subprocess.Popen
    spec: LinkSpec

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_link(target_port: int, spec: LinkSpec, timeout: float = 20) -> RunningLink:
    """The proxy in a process of its own (its CPU must not be the benchmark's GIL)."""
    proc = subprocess.Popen([sys.executable, "-m", "dlio_ckpt_ext.tools.remote_link", "--target",
                             f"{LOOPBACK}:{target_port}", "--latency-ms", str(spec.latency_ms),
                             "--rate-mb-s", str(spec.rate_mb_s)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    if not line.startswith("listening ") or time.monotonic() > deadline:
        proc.kill()
        raise RuntimeError(f"remote link did not start: {line!r}")
    return RunningLink(int(line.split()[1].rsplit(":", 1)[1]), proc, spec)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help=f"{LOOPBACK}:PORT of the server behind the link")
    ap.add_argument("--listen-port", type=int, default=0, help="default: a free port")
    ap.add_argument("--latency-ms", type=float, default=10.0, help="added one-way latency (default 10)")
    ap.add_argument("--rate-mb-s", type=float, default=40.0, help="per-connection cap, MB/s; 0 = none")
    args = ap.parse_args(argv)
    spec = LinkSpec(args.latency_ms, args.rate_mb_s)

    def ready(port: int) -> None:
        print(f"listening {LOOPBACK}:{port} -> {args.target} ({spec})", flush=True)

    try:
        asyncio.run(_serve(args.listen_port, _parse_target(args.target), spec, ready))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
