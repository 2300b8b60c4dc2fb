"""Lets `dlio_benchmark workload=<preset>` find dlio-ckpt-ext's presets
without --config-dir. hydra_plugins is a namespace package that hydra scans."""
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


def presets_location() -> str:
    """configs/dlio of the checkout this plugin runs from (editable install),
    else the same directory installed as package dlio_ckpt_ext.configs."""
    checkout = Path(__file__).resolve().parents[2] / "configs" / "dlio"
    if (checkout / "workload").is_dir():
        return f"file://{checkout}"
    return "pkg://dlio_ckpt_ext.configs"


class DlioCkptExtSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="dlio-ckpt-ext", path=presets_location())
