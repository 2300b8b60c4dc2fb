"""Our adapters for MLCommons' fork, tested where the fork is not installed:
its checkpoint loop's calls into our mechanism (replayed by fork_loop.py on
this environment's DLIO), and what its LoadConfig leaves in the storage
options (credentials copied from the environment). The fork's storage keys
(storage_library, direct_fs, uri_scheme) are tested in test_config.py; the
fork itself, where a checkout of it is installed, in test_mlcommons.py."""
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from conftest import tool
from dlio_ckpt_ext.config import MECHANISM_CLASS
from dlio_run import SHRINK
from test_dlio_integration import SMALL_8B, TWO_ONE, expected_files, on_disk

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

GiB = float(1 << 30)


def run_fork_loop(workdir: Path, preset: str, *overrides: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """fork_loop.py on 2 ranks: its output, what the loop saw, our record."""
    out = workdir / "out"
    res = subprocess.run([tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable,
                          str(Path(__file__).with_name("fork_loop.py")), f"workload={preset}", *SHRINK,
                          *overrides, f"++workload.output.folder={out}",
                          f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}"],
                         cwd=workdir, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return (res, json.loads((out / "fork_loop.json").read_text()),
            json.loads((out / "ckpt_ext_summary.json").read_text()))


def test_the_forks_checkpoint_loop_drives_our_mechanism(workdir):
    res, seen, record = run_fork_loop(workdir, "llama3_8b_checkpoint", *TWO_ONE)
    files = expected_files((1, 2), 2, SMALL_8B)
    assert on_disk(workdir / "ckpt") == files
    assert seen["mechanism"] == "StreamingCheckpointing" and record["status"] == "success"
    # the fork's stats divide by checkpoint_size: GiB of one whole checkpoint, all ranks
    assert seen["checkpoint_size"] * GiB == pytest.approx(sum(files.values()) / 2, rel=1e-12)
    assert record["checkpoint_bytes"] == sum(files.values()) // 2
    # its count before the reads: one entry per checkpoint written
    assert seen["walk_node"] == ["global_epoch1_step1", "global_epoch1_step2"]
    assert [s["files"] for s in seen["saves"]] == [2, 2] and [s["files"] for s in seen["loads"]] == [2]
    # with a DLIO that reports metrics itself, ours are [INFO] lines, one per phase
    assert len(re.findall(r"^\[INFO\] global window: Checkpoint save I/O Throughput", res.stdout, re.M)) == 1
    assert not re.search(r"^\[METRIC\]", res.stdout, re.M)
    assert (record["save"]["checkpoints"], record["load"]["checkpoints"]) == (2, 1)


def test_the_forks_checkpoint_loop_loads_one_publish_more_times_than_it_was_published(workdir):
    """The fork's loop reads no more checkpoints than the folder lists; a model load
    reads its one publish for every load, so the publish is listed once a load."""
    _, seen, record = run_fork_loop(workdir, "llama3_8b_model_load", "++workload.model_load.max_shard_size=1MB",
                                    "++workload.checkpoint.num_checkpoints_write=1",
                                    "++workload.checkpoint.num_checkpoints_read=3")
    assert sorted(p.name for p in (workdir / "ckpt").iterdir()) == ["publish-1"]
    assert seen["walk_node"] == ["publish-1"] * 3
    assert len(seen["saves"]) == 1 and [s["files"] for s in seen["loads"]] == [seen["loads"][0]["files"]] * 3
    assert seen["loads"][0]["files"] > 0
    assert (record["status"], record["save"]["checkpoints"], record["load"]["checkpoints"]) == ("success", 1, 3)


def fork_load_config(args, config):
    """What the fork's LoadConfig does with the storage section: the workload's
    options, then AWS_* credentials from the environment copied into them."""
    args.storage_type = config["storage"]["storage_type"]
    args.storage_options = dict(config["storage"]["storage_options"])
    for env_key, key in (("AWS_ACCESS_KEY_ID", "access_key_id"), ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
                         ("AWS_ENDPOINT_URL", "endpoint_url")):
        args.storage_options.setdefault(key, f"from-{env_key}")


@pytest.mark.parametrize("storage_type, given, kept", [
    ("s3", {"part_size": "16MiB"}, {"part_size": "16MiB", "storage_library": "s3dlio"}),
    ("s3", {"storage_library": "s3dlio", "secret_access_key": "inline"}, {"storage_library": "s3dlio"}),
    ("local_fs", {}, {}),
])
def test_the_forks_copied_credentials_are_dropped_and_its_storage_library_defaults_to_s3dlio(
        monkeypatch, storage_type, given, kept):
    import dlio_benchmark.main as dlio_main
    from dlio_benchmark.common.enumerations import StorageType

    from dlio_ckpt_ext.dlio import context, storage
    workload = OmegaConf.create({"storage": {"storage_type": storage_type, "storage_options": given},
                                 "checkpoint": {"checkpoint_mechanism_classname": MECHANISM_CLASS}})
    monkeypatch.setattr(context, "_workload", workload)
    monkeypatch.setattr(dlio_main, "LoadConfig",
                        lambda args, config: (fork_load_config(args, config),
                                              setattr(args, "storage_type", StorageType(storage_type))))
    storage._install_fork_storage_library()
    args = SimpleNamespace(checkpoint_mechanism_classname=MECHANISM_CLASS)
    dlio_main.LoadConfig(args, workload)
    assert args.storage_options == kept
    # a workload that does not name our mechanism keeps what the fork made of it
    other = SimpleNamespace(checkpoint_mechanism_classname="dlio_benchmark.checkpointing.pytorch_checkpointing.X")
    dlio_main.LoadConfig(other, workload)
    assert other.storage_options["secret_access_key"] == given.get("secret_access_key",
                                                                   "from-AWS_SECRET_ACCESS_KEY")
