"""Lets `dlio_benchmark workload=<preset>` find dlio-ckpt-ext's presets
without --config-dir. hydra_plugins is a namespace package that hydra scans
(before it composes a config, so the resolver below is there in time)."""
import os
import re
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf


def presets_location() -> str:
    """configs/dlio of the checkout this plugin runs from (editable install),
    else the same directory installed as package dlio_ckpt_ext.configs."""
    checkout = Path(__file__).resolve().parents[2] / "configs" / "dlio"
    if (checkout / "workload").is_dir():
        return f"file://{checkout}"
    return "pkg://dlio_ckpt_ext.configs"


def job_id() -> str:
    """The same on every rank of one mpirun and different for two runs on
    one host at once: the launcher's pid from Open MPI's PMIx namespace
    ('prterun-<host>-<pid>@1'), else this process's pid (a run without mpirun)."""
    found = re.search(r"-(\d+)@", os.environ.get("PMIX_NAMESPACE", ""))
    return found.group(1) if found else str(os.getpid())


OmegaConf.register_new_resolver("ckpt_ext_job", job_id, replace=True)


class DlioCkptExtSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="dlio-ckpt-ext", path=presets_location())
