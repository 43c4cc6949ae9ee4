"""experts_int8: Mixture-of-Experts inference with int8 expert weights (W8A16) in one fused Triton kernel."""

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING

from . import reference
from .ops import fused_experts, fused_moe
from .quant import dequantize_weights, quantize_weights
from .routing import select_experts

if TYPE_CHECKING:  # the names __getattr__ imports on first use, as type checkers and IDEs must see them
    from .integrations.transformers import ExpertsInt8Config, ExpertsInt8HfQuantizer, quantize_
    from .layer import Int8Experts

__version__ = "0.1.0"

_TRANSFORMERS_EXPORTS = ("ExpertsInt8Config", "ExpertsInt8HfQuantizer", "quantize_")


def _register_with_transformers() -> None:
    """Register quant_method "experts_int8" with transformers, as soon as transformers is imported.

    transformers has no plugin hook for quantizers, and a checkpoint whose quant_method it does not know
    loads with only a warning: the int8 expert tensors become float weights of the wrong scale. So a bare
    ``import experts_int8`` must be enough to reload an int8 checkpoint. The integration (about two seconds
    of imports) loads right after transformers does, so the kernels alone and the CLI's help do not pay for
    it. A transformers the integration cannot use is left alone here: naming ExpertsInt8Config says why.
    """
    if "transformers" in sys.modules:
        _load_integration()
    elif importlib.util.find_spec("transformers") is not None:
        _remove_hooks()  # (a reload's: one is enough)
        sys.meta_path.insert(0, _AfterTransformers())


def _remove_hooks() -> None:
    for finder in [f for f in sys.meta_path if getattr(f, "_experts_int8_hook", False)]:
        sys.meta_path.remove(finder)


def _load_integration() -> None:
    try:
        importlib.import_module(".integrations.transformers", __name__)
    except ImportError:
        pass


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands out transformers' own spec, whose loader loads the integration once
    transformers' package has run (whichever transformers module is imported first: its package runs first).
    It stays in ``sys.meta_path`` until then: a lookup alone (``importlib.util.find_spec("transformers")``, how
    libraries such as accelerate check that transformers is installed) imports nothing, and took it away, so the
    import that followed registered nothing."""

    _experts_int8_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformers":
            return None
        for finder in list(sys.meta_path):  # the other finders, as the import system asks them
            if getattr(finder, "_experts_int8_hook", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _ThenIntegration(spec.loader)
        return spec


class _ThenIntegration(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _remove_hooks()
        _load_integration()

    def __getattr__(self, name):  # (get_resource_reader, is_package, ...: transformers' own loader's)
        return getattr(self.loader, name)


_register_with_transformers()


def __getattr__(name):
    if name in _TRANSFORMERS_EXPORTS:
        from .integrations import transformers as _hf

        return getattr(_hf, name)
    if name == "Int8Experts":
        from .layer import Int8Experts

        return Int8Experts
    raise AttributeError(f"module 'experts_int8' has no attribute {name!r}")


__all__ = [
    "__version__",
    "ExpertsInt8Config",
    "ExpertsInt8HfQuantizer",
    "Int8Experts",
    "quantize_",
    "dequantize_weights",
    "fused_experts",
    "fused_moe",
    "quantize_weights",
    "reference",
    "select_experts",
]
