"""No output of any tool, stream or file holds a credential, whatever form or
key it was given under: a run, a failed run, a sweep, a submission, a report."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BUCKET, REPO, tool
from dlio_run import run_dlio, submitted_or_only_timing_broken
from s3_server import SECRET_KEY

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

SMALL = ["++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1",
         "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/cred"]
#: each supported way of giving the secret, with the environment it runs in
FORMS = {
    "override": ([f"++workload.storage.storage_options.secret_access_key={SECRET_KEY}"], False),
    "dict": (["++workload.storage.storage_options={secret_access_key:" + SECRET_KEY + ",max_in_flight:8}"], False),
    "environment": ([], True),
}


def env_for(s3, secret_in_env: bool) -> dict:
    env = dict(s3.env())
    env["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY if secret_in_env else ""
    return env


def copy_of_our_source(root: Path, path: Path) -> bool:
    """A file of a submission's code image that is byte for byte the package's
    own (the local server's built-in test key is a literal in its source)."""
    parts = path.relative_to(root).parts
    if "code-images" not in parts:
        return False
    image = parts.index("code-images") + 2  # code-images/code-<hash8>/...
    source = REPO.joinpath(*parts[image:])
    return source.is_file() and source.read_bytes() == path.read_bytes()


def leaks(root: Path, *streams: str) -> list[str]:
    """Every file below root (but the S3 server's own data and copies of our
    source) and stream holding the secret."""
    found = [f"stream {i}" for i, text in enumerate(streams) if SECRET_KEY in text]
    for path in root.rglob("*"):
        if path.is_file() and "seaweedfs" not in path.parts and SECRET_KEY.encode() in path.read_bytes() \
                and not copy_of_our_source(root, path):
            found.append(str(path.relative_to(root)))
    return found


@pytest.mark.parametrize("form", FORMS)
def test_a_run_a_failed_run_and_a_report_hold_no_credential(s3, workdir, form):
    overrides, in_env = FORMS[form]
    env = env_for(s3, in_env)
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *SMALL, *overrides, env=env, checkpoint_folder=form)
    assert run.returncode == 0, run.output[-3000:]
    report = subprocess.run([tool("dlio-ckpt-report"), "run", str(run.out)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    # failures: a missing bucket (the storage error, with the form's options), and where the
    # secret came in an override, a misspelt key beside it (validation echoes values); one rank
    # each: both are refused before any rank's I/O, on every rank alike
    failed = []
    if overrides:
        typo = run_dlio(workdir, 1, "llama3_tiny_checkpoint", *SMALL,
                        f"++workload.storage.storage_options.secret_key={SECRET_KEY}", *overrides, env=env, out="typo")
        assert typo.returncode != 0 and "workload.storage.storage_options.secret_key" in typo.stderr
        failed += [typo.stdout, typo.stderr]
    nobucket = run_dlio(workdir, 1, "llama3_tiny_checkpoint", *SMALL, *overrides,
                        "++workload.storage.storage_root=s3://no-such-bucket/x", env=env, out="nobucket")
    assert nobucket.returncode != 0 and "no-such-bucket" in nobucket.stderr
    assert leaks(workdir, run.stdout, run.stderr, report.stdout, report.stderr, nobucket.stdout, nobucket.stderr,
                 *failed) == []


def test_a_sweep_and_a_submission_hold_no_credential(s3, workdir):
    overrides, _ = FORMS["override"]
    env = {**env_for(s3, False)}
    sweep = subprocess.run([tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2",
                            tool("dlio_benchmark"), "-m", "workload=llama3_tiny_checkpoint", *SMALL, *overrides,
                            "++workload.checkpoint.checkpoint_folder=sweep",
                            "++workload.streaming.pool_depth=2", f"hydra.sweep.dir={workdir / 'sweep'}"],
                           cwd=workdir, env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=300)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    table = subprocess.run([tool("dlio-ckpt-report"), "sweep", str(workdir / "sweep")], capture_output=True,
                           text=True)
    assert table.returncode == 0, table.stderr
    submit = subprocess.run([tool("dlio-ckpt-submit"), "--workload", "llama3_tiny_checkpoint", "--ranks-per-host",
                             "2", "--open", "--accelerator-type", "b200", "--results-dir", str(workdir / "sub"), "--", *SMALL, *overrides,
                             "++workload.checkpoint.checkpoint_folder=sub"],
                            cwd=workdir, env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=300)
    assert submitted_or_only_timing_broken(submit.returncode, submit.stderr), submit.stderr[-3000:]
    assert len(list((workdir / "sub").rglob("ckpt_ext_summary.json"))) == 2
    assert "secret_access_key=<redacted>" in submit.stdout
    assert leaks(workdir, sweep.stdout, sweep.stderr, table.stdout, table.stderr, submit.stdout,
                 submit.stderr) == []
