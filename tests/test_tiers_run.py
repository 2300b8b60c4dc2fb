"""Two tiers end to end through dlio_benchmark: the local tier's files rotating
on a real directory, the persistent saves on a file system and on a real S3
server (SeaweedFS) behind a slowed link, every TIERS figure recomputed from
the record's windows, an overrun said as it happens, an interrupted persist
never counted as done."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import BUCKET, tool
from dlio_ckpt_ext.shared_plans import tier_plan
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer

from dlio_ckpt_ext.result_files import RECORD_FILE
from dlio_ckpt_ext.tools.presets import compose_config
from dlio_run import SHRINK, dlio_command, run_dlio
from test_s3_run import open_uploads_after, run_on_a_terminal_until

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PRESET = "llama3_8b_checkpoint"
GiB = float(1 << 30)


def tiers(local: Path, every: int = 2, writes: int = 4, interval: float = 60.0, jump: int = 1) -> list[str]:
    return [*SHRINK, f"++workload.checkpoint.num_checkpoints_write={writes}",
            "++workload.checkpoint.num_checkpoints_read=0", f"++workload.tiers.local_root={local}",
            f"++workload.tiers.persistent_every={every}", f"++workload.tiers.interval_s={interval}",
            f"++workload.tiers.replication_jump={jump}"]


class IterationWatch:
    """Polls each rank's local folder while a run goes: the most iterations any
    held at once, and every .dirty name seen."""

    def __init__(self, local: Path) -> None:
        self.local, self.most, self.dirty = local, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            for folder in self.local.glob("*"):
                try:
                    names = os.listdir(folder)
                except OSError:
                    continue
                self.most = max(self.most, len({n.split("_")[1] for n in names if n.startswith("iter_")}))
                self.dirty |= {n for n in names if ".dirty." in n}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def recomputed(record: dict) -> dict:
    """The TIERS figures from the record's windows alone, written apart from results/tiers.py."""
    local, persist = record["tiers"]["local_windows"], record["save"]["per_checkpoint"]
    interval, ranks = record["tiers"]["settings"]["interval_s"], record["ranks"]
    took = lambda w: w["end"] - w["start"]  # noqa: E731
    beside = [any(p["start"] < w["end"] and w["start"] < p["end"] for p in persist) for w in local]
    during = [took(w) for w, b in zip(local, beside) if b]
    alone = [took(w) for w, b in zip(local, beside) if not b]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {"local_s_mean": mean([took(w) for w in local]),
            "local_gib_s_mean": mean([w["bytes"] / GiB / took(w) for w in local]),
            "local_per_rank_gib_s_mean": mean([w["bytes"] / ranks / GiB / took(w) for w in local]),
            "foreground_slowdown": mean(during) / mean(alone) if during and alone else None,
            "local_during_persist": len(during), "local_alone": len(alone),
            "persistent": [(p["step"], took(p), interval - took(p), took(p) <= interval) for p in persist]}


def assert_tiers_as_recomputed(record: dict, stdout: str) -> dict:
    got, want = record["tiers"], recomputed(record)
    for key in ("local_s_mean", "local_gib_s_mean", "local_per_rank_gib_s_mean"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
    assert (got["local_during_persist"], got["local_alone"]) == (want["local_during_persist"], want["local_alone"])
    if want["foreground_slowdown"] is None:
        assert got["foreground_slowdown"] is None and "local save with a persist    n/a" in stdout
    else:
        assert got["foreground_slowdown"] == pytest.approx(want["foreground_slowdown"], rel=1e-9)
        assert f": {want['foreground_slowdown']:.2f}x (the background save's cost to the foreground)" in stdout
    assert [(r["step"], r["fit"]) for r in got["persistent"]] == [(s, f) for s, _, _, f in want["persistent"]]
    assert [x for r in got["persistent"] for x in (r["duration_s"], r["slack_s"])] == pytest.approx(
        [x for _, took, slack, _ in want["persistent"] for x in (took, slack)])
    for step, took, slack, fit in want["persistent"]:
        assert re.search(rf"^  persistent save {step} +{took:.4f} s at [\d.]+ GiB/s, interval [\d.]+ s, slack "
                         rf"{slack:.4f} s, {'fit' if fit else 'DID NOT FIT'}", stdout, re.M), stdout[-3000:]
    fit = sum(f for *_, f in want["persistent"])
    assert f"persistent saves that fit    {fit} of {len(want['persistent'])} (persist thread at nice " in stdout
    return want


def verify_persistent(ranks: int, steps: list[int], folder: str, *storage: str, env: dict | None = None) -> None:
    """Every rank's files of each persistent checkpoint read back, each byte compared
    with the content regenerated from its seed (as a run without tiers would write it).
    In a child process: s3dlio's client is process-wide and keeps the endpoint it was
    first given, maybe an earlier test's server long gone."""
    code = "import json, sys\nfrom test_tiers_run import read_back_verified\nread_back_verified(*json.loads(sys.argv[1]))"
    res = subprocess.run([sys.executable, "-c", code, json.dumps([ranks, steps, folder, list(storage)])],
                         cwd=Path(__file__).parent, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def read_back_verified(ranks: int, steps: list[int], folder: str, storage: list[str]) -> None:
    cfg = compose_config(PRESET, [*SHRINK, "++workload.checkpoint.num_checkpoints_write=0",
                                  "++workload.checkpoint.num_checkpoints_read=1", "++workload.streaming.verify=True",
                                  f"++workload.checkpoint.checkpoint_folder={folder}", *storage], ranks)
    for rank in range(ranks):
        ck = Checkpointer(cfg, rank, ranks, ranks)
        ck.prepare()
        for step in steps:
            assert sum(f.nbytes for f in ck.load(step)) == ck.rank_bytes(rank)
        ck.close()


def test_local_saves_rotate_and_persistent_ones_land_whole_on_a_file_system(workdir):
    local = workdir / "local"
    watch = IterationWatch(local)
    try:
        run = run_dlio(workdir, 4, PRESET, *tiers(local))
    finally:
        watch.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    cfg = compose_config(PRESET, tiers(local), 4)
    part = lambda r: cfg.layout.rank_plan(cfg.shape, cfg.parallelism, 4, r).total_bytes  # noqa: E731
    # the local tier: the last iteration's parts of each rank's group, nothing half-written, never 3 iterations
    for rank in range(4):
        got = {p.name: p.stat().st_size for p in (local / str(rank)).iterdir()}
        assert got == {tier_plan.local_name(4, r): part(r) for r in tier_plan.group(rank, 2, 1)}
    # (the watch may see no iteration at all on a loaded machine: only its upper bound is the run's)
    assert watch.most <= 2 and watch.dirty <= {tier_plan.local_name(s, r, dirty=True)
                                                    for s in range(1, 5) for r in range(4)}
    # the persistent tier: checkpoints 2 and 4 only, each file at its size, each byte as generated
    ckpt = workdir / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == [
        cfg.layout.checkpoint_dir(2), cfg.layout.checkpoint_dir(4)]
    files = len(cfg.layout.saved_files(cfg.shape, cfg.parallelism, 4))
    assert f"[INFO] inventory: {2 * files} files present, {2 * files} expected, sizes match" in run.stdout
    verify_persistent(4, [2, 4], str(ckpt))
    record = run.record()
    want = assert_tiers_as_recomputed(record, run.stdout)
    assert len(record["tiers"]["local_windows"]) == 4 and len(want["persistent"]) == 2
    # every part is kept twice (replication 2): a local save writes two checkpoints' bytes
    assert all(w["bytes"] == 2 * record["checkpoint_bytes"] for w in record["tiers"]["local_windows"])
    # the persist threads' nice raised to 10 (never lowered: CI runs some tests at nice 19 already)
    assert record["tiers"]["settings"] | {"local_root": None} == {
        "local_root": None, "persistent_every": 2, "replication": 2, "replication_jump": 1, "interval_s": 60.0,
        "nice": max(os.getpriority(os.PRIO_PROCESS, 0), 10), "io_class": "idle", "same_file_system": True}
    # said once, at the start: both tiers are this machine's one disk
    assert run.stdout.count(f"[WARNING] workload.tiers.local_root {local} is on the same file system") == 1


@pytest.mark.parametrize("case", ["another run's files", "copies on no other node"])
def test_a_local_tier_that_cannot_work_is_refused_on_every_rank_naming_the_key(workdir, case):
    local = workdir / "local"
    if case == "another run's files":
        (local / "1").mkdir(parents=True)
        (local / "1" / "iter_0000003_1_local.pt").write_bytes(b"left")
        run = run_dlio(workdir, 2, PRESET, *tiers(local))
        said = (f"[ERROR] workload.tiers.local_root: {local / '1'} holds local checkpoints "
                "(iter_0000003_1_local.pt) of an earlier or live run")
    else:  # NVRx's default jump is the ranks of a node: 2 ranks on one node cannot tile groups 2 apart
        run = run_dlio(workdir, 2, PRESET, *tiers(local, jump=0))
        said = "[ERROR] invalid config: workload.tiers.replication=2; allowed: a factor whose groups tile the 2 ranks"
    assert run.returncode != 0
    assert said in run.stderr, run.stderr[-3000:]
    assert not (workdir / "ckpt").exists() or not any((workdir / "ckpt").glob("global_*"))


@pytest.fixture
def slowed(s3):
    """SeaweedFS behind a link of 8 MB/s a connection: a rank's persist takes over a second."""
    from dlio_ckpt_ext.tools.remote_link import LinkSpec, start_link
    link = start_link(int(s3.endpoint.rsplit(":", 1)[1]), LinkSpec(latency_ms=2, rate_mb_s=8))
    yield {**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{link.port}"}
    link.stop()


def test_a_persistent_save_behind_a_slowed_store_overruns_its_interval_and_is_warned(s3, slowed, workdir):
    storage = ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/tiers"]
    run = run_dlio(workdir, 2, PRESET, *tiers(workdir / "local", interval=0.3), *storage, env=slowed,
                   checkpoint_folder="slow")
    assert run.returncode == 0, run.stderr[-3000:]
    # said while it ran, by rank 0, and again in RESULTS with each save's time
    assert "[WARNING] persistent save of checkpoint 2 is still running after its interval of 0.3 s " \
           "(workload.tiers.interval_s)" in run.stderr, run.stderr[-3000:]
    record = run.record()
    want = assert_tiers_as_recomputed(record, run.stdout)
    late = [step for step, _, _, fit in want["persistent"] if not fit]
    assert late == [2, 4]
    assert re.search(r"^\[WARNING\] persistent save\(s\) of checkpoint step\(s\) 2, 4 did not fit in their 0.3 s "
                     r"interval \(workload.tiers.interval_s\): [\d.]+ s, [\d.]+ s", run.stdout, re.M)
    # what landed: exactly the two persistent checkpoints, every object whole, every byte as generated
    cfg = compose_config(PRESET, [*tiers(workdir / "local", interval=0.3), *storage], 2)
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="tiers/slow/")["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {
        f"tiers/slow/{cfg.layout.checkpoint_dir(step)}/{name}": size for step in (2, 4)
        for name, size in cfg.layout.saved_files(cfg.shape, cfg.parallelism, 2).items()}
    verify_persistent(2, [2, 4], "slow", *storage, env=s3.env())


def test_an_interrupted_persist_leaves_no_checkpoint_counted_as_done(s3, slowed, workdir):
    cmd = dlio_command(workdir, 2, PRESET, *tiers(workdir / "local", writes=40, interval=0.2),
                       "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/cut",
                       checkpoint_folder="c")
    code, out = run_on_a_terminal_until(cmd, {**os.environ, **slowed, "TF_CPP_MIN_LOG_LEVEL": "3"},
                                        re.compile(r"persistent save of checkpoint 4 is still running"),
                                        lambda proc: os.kill(proc.pid, signal.SIGTERM))
    assert code != 0
    assert re.search(r"\[ERROR\] rank 0: checkpoint persist 4 interrupted by SIGTERM; its partial file or open "
                     r"upload was removed", out), out[-3000:]
    assert not (workdir / "out" / RECORD_FILE).exists() and not re.search(r"^\[METRIC\]", out, re.M)
    status = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out")], capture_output=True,
                            text=True, env={**os.environ, **slowed})
    assert status.returncode == 1, status.stdout + status.stderr
    # checkpoint 2 persisted whole before; 4 was cut: never among the complete ones
    assert re.search(r"complete \(every file at its planned size\): 2\n", status.stdout), status.stdout
    assert "checkpoint 4 incomplete" in status.stdout or "not started: 4-40 (19)" in status.stdout, status.stdout
    assert open_uploads_after(s3, "cut/", seconds=30) == []
