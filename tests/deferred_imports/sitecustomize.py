"""TensorFlow imported on first use, in the tests' DLIO processes only.

DLIO 2.0.0's main imports its TensorFlow profiler module at start, which imports
TensorFlow (about 2 s of a core), for profiler=tensorboard alone: no test uses
it, and CI starts about 330 ranks. tests/conftest.py puts this folder on the
PYTHONPATH of every process a test starts; DLIO's code runs unchanged, and the
first attribute it takes from TensorFlow imports the real one. The install check
(DLIO_TEST_EAGER_IMPORTS=1 in .ci/run) runs DLIO as a user does, TensorFlow
imported at start.

dftracer's Profile() walks every loaded module's __file__ (inspect.stack) at
import, and a check that TensorFlow is installed (importlib.util.find_spec)
reads its __spec__: the stand-in answers the module's identity itself and
imports TensorFlow for anything else.
"""
import importlib
import importlib.util
import sys
import types

NAME = "tensorflow"


class _Deferred(types.ModuleType):
    def __getattr__(self, attr: str):
        # only attributes the stand-in lacks come here; __path__ too, so a submodule's
        # import loads the real package first
        if sys.modules.get(NAME) is self:
            del sys.modules[NAME]
        real = importlib.import_module(NAME)
        return getattr(real, attr)


def _defer() -> None:
    if NAME in sys.modules:
        return
    spec = importlib.util.find_spec(NAME)
    if spec is None or spec.origin is None:
        return
    stand_in = _Deferred(NAME)
    stand_in.__file__, stand_in.__spec__ = spec.origin, spec
    sys.modules[NAME] = stand_in


_defer()
