"""Several hosts on one machine, for mpirun --host: each host a network
namespace with an address of its own on a bridge and a host name of its own
(UTS namespace), and tests/cluster_ssh.sh in place of ssh, which starts the
MPI daemon inside the named host's namespaces. They share the file system (a
shared checkpoint file system) and reach the root namespace at the bridge's
address (where a test's S3 server listens). Open MPI 5's daemons do not
bootstrap over loopback alone, hence a network of their own. Needs root.

By hand:
    python tests/cluster.py up 3      # prints the mpirun options to add
    mpirun <those options> -np 3 dlio_benchmark workload=...
    python tests/cluster.py down
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import count
from pathlib import Path

AGENT = Path(__file__).with_name("cluster_ssh.sh")
#: clusters made by this process: each gets names and a /24 of its own, since
#: the kernel may still be removing the last one's links when the next is made
_made = count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def why_not() -> str | None:
    """Why an emulated cluster cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for cmd in ("ip", "unshare"):
        if shutil.which(cmd) is None:
            return f"no {cmd} command"
    return None


class Cluster:
    """`hosts` hosts named node1..nodeN. `tag` (1-250) keeps clusters apart:
    every name and the /24 derive from it; by default one per cluster made."""

    def __init__(self, hosts: int, tag: int | None = None) -> None:
        self.tag = 1 + (os.getpid() * 7 + next(_made)) % 250 if tag is None else tag
        self.names = [f"node{i}" for i in range(1, hosts + 1)]
        self.bridge = f"ckbr{self.tag}"
        self.subnet = f"10.213.{self.tag}.0/24"
        self.address = f"10.213.{self.tag}.1"  # the root namespace, as the hosts see it

    def namespace(self, host: str) -> str:
        return f"ck{self.tag}-{host}"

    def veth(self, i: int) -> str:
        return f"ckv{self.tag}-{i}"

    def up(self) -> "Cluster":
        self.down()  # a cluster of this tag left over by a killed run
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, host in enumerate(self.names, 1):
                ns, veth = self.namespace(host), self.veth(i)
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"10.213.{self.tag}.{10 + i}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            self.down()
            raise RuntimeError(f"emulated cluster: {' '.join(exc.cmd)} failed: {exc.stderr.strip()}") from exc
        return self

    def pids(self, host: str) -> list[int]:
        res = _ip("netns", "pids", self.namespace(host), check=False)
        return [int(p) for p in res.stdout.split()]

    def kill(self, host: str) -> list[int]:
        """The host is lost: every process in it killed at once (its MPI daemon
        and its ranks), as when a machine dies."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def down(self) -> None:
        """Remove everything of this tag; safe to call twice."""
        for host in self.names:
            self.kill(host)
        deadline = time.time() + 5
        while any(self.pids(h) for h in self.names) and time.time() < deadline:
            time.sleep(0.1)
        for i, host in enumerate(self.names, 1):
            _ip("link", "del", self.veth(i), check=False)  # its peer goes with it
            _ip("netns", "del", self.namespace(host), check=False)
        _ip("link", "del", self.bridge, check=False)

    def slow_link(self, host: str, mbit: int) -> None:
        """The host's link limited to `mbit` Mbit/s both ways (tc's token bucket
        on each end of its veth): a slow node among fast ones."""
        shape = ["root", "tbf", "rate", f"{mbit}mbit", "burst", "64kb", "latency", "2s"]
        subprocess.run(["ip", "netns", "exec", self.namespace(host), "tc", "qdisc", "add", "dev", "eth0", *shape],
                       check=True, capture_output=True)
        subprocess.run(["tc", "qdisc", "add", "dev", self.veth(self.names.index(host) + 1), *shape], check=True,
                       capture_output=True)

    def env(self) -> dict[str, str]:
        """What the ssh stand-in needs (mpirun passes its environment on to it)."""
        return {"CK_CLUSTER_NS_PREFIX": f"ck{self.tag}-"}

    def mpirun_args(self, ranks_per_host: int | list[int]) -> list[str]:
        """Options for mpirun: the ssh stand-in, the cluster's network for the
        daemons and for MPI's TCP transport, and --host. No --oversubscribe:
        with it Open MPI put every rank on the first host."""
        per = ranks_per_host if isinstance(ranks_per_host, list) else [ranks_per_host] * len(self.names)
        return self.launch_args() + ["--host", ",".join(f"{h}:{n}" for h, n in zip(self.names, per))]

    def launch_args(self) -> list[str]:
        """mpirun_args without --host (for a tool that names the hosts itself)."""
        return ["--mca", "plm_ssh_agent", str(AGENT), "--prtemca", "prte_if_include", self.subnet,
                "--mca", "btl_tcp_if_include", self.subnet, "--mca", "btl", "self,tcp,sm"]

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    reason = why_not()
    if reason:
        print(f"cluster: cannot: {reason}", file=sys.stderr)
        return 1
    hosts = int(argv[1]) if len(argv) > 1 else 8
    cluster = Cluster(hosts, tag=19)  # by hand: one fixed tag, so that down finds it
    if argv[0] == "down":
        cluster.down()
        return 0
    cluster.up()
    env = " ".join(f"{k}={v}" for k, v in cluster.env().items())
    print(f"export {env}\nmpirun options: {' '.join(cluster.mpirun_args(1))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
