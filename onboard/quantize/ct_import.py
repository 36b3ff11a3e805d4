"""Import compressed-tensors without the 8 s it costs by default.

``import compressed_tensors`` runs the whole package's ``__init__``, which imports
transformers (and through it scikit-learn, pandas and torch.distributed) for its
model-level helpers, and applies ``torch.compile`` to a few functions at import,
which imports torch's compiler (dynamo, inductor). Measured here: 8.3 s of a 17 s
``onboard quantize`` of a 1 GB checkpoint, against 0.3 s for what onboard calls
(presets, ``QuantizationConfig``, ``calculate_qparams``, ``generate_gparam``, the
compressors). So, when neither is loaded yet:

- ``transformers`` and its submodules are served as empty stand-in modules for the
  duration of the import (a name imported from them is an empty class). onboard
  never calls the library's model-level code (``ModelCompressor``, offloading,
  attention, KV cache) that would use them; the stand-ins are removed from
  ``sys.modules`` afterwards, so a later ``import transformers`` (the nvfp4
  calibration) gets the real package.
- ``torch.compile`` returns the function unchanged during the import: onboard runs
  the library's compiled helpers eagerly anyway (same values, no per-process
  compile; see kernels.library_compress).

The library's results are still checked byte for byte against onboard's loops at
run time (kernels.check_against_library), in the process that did this import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

_STUBBED = ("transformers",)


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in _STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def import_compressed_tensors() -> None:
    """Import compressed_tensors (once per process) the lean way described above."""
    if "compressed_tensors" in sys.modules:
        return
    import torch

    stub = not any(name in sys.modules for name in _STUBBED)
    finder = _StandInFinder()
    compile_ = torch.compile
    if stub:
        sys.meta_path.insert(0, finder)
    if "torch._dynamo" not in sys.modules:
        torch.compile = _no_compile
    try:
        import compressed_tensors.compressors  # noqa: F401
        import compressed_tensors.quantization  # noqa: F401
    finally:
        torch.compile = compile_
        if stub:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n.split(".")[0] in _STUBBED]:
                if isinstance(sys.modules[name], _StandIn):
                    del sys.modules[name]


def _no_compile(fn=None, **_kwargs):
    return fn if fn is not None else (lambda f: f)
