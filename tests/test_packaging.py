"""The presets are found by dlio_benchmark's hydra app from an installed copy
of the package too, not only from this checkout."""
import subprocess
import sys
import sysconfig

from conftest import REPO

CODE = """
import sys
from hydra import compose, initialize_config_module
import hydra_plugins.dlio_ckpt_ext_searchpath as plugin
with initialize_config_module(config_module="dlio_benchmark.configs", version_base=None):
    cfg = compose(config_name="config", overrides=["workload=llama3_405b_checkpoint"])
print(plugin.presets_location(), cfg.workload.model.name, cfg.workload.model.parallelism.pipeline)
"""


def test_non_editable_install_finds_the_presets(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(REPO)], check=True, capture_output=True)
    # -S: no .pth files, so the editable checkout is not on the path; the
    # environment's site-packages still provide hydra and DLIO.
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}"}
    out = subprocess.run([sys.executable, "-S", "-c", CODE], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["pkg://dlio_ckpt_ext.configs", "llama3_405b", "32"]
