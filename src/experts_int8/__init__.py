"""experts_int8: Mixture-of-Experts inference with int8 expert weights (W8A16) in one fused Triton kernel."""

from . import reference
from .ops import fused_experts, fused_moe
from .quant import dequantize_weights, quantize_weights
from .routing import select_experts

__version__ = "0.1.0"

_TRANSFORMERS_EXPORTS = ("ExpertsInt8Config", "ExpertsInt8HfQuantizer", "quantize_")


def _register_with_transformers() -> None:
    """Register quant_method "experts_int8" with transformers when it is installed.

    transformers has no plugin hook for quantizers, and a checkpoint whose quant_method it does not know
    loads with only a warning: the int8 expert tensors become float weights of the wrong scale. So a bare
    ``import experts_int8`` must be enough to reload an int8 checkpoint; it costs about a second of import.
    A transformers the integration cannot use is left alone here: naming ExpertsInt8Config says why.
    """
    import importlib
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return
    try:
        importlib.import_module(".integrations.transformers", __name__)
    except ImportError:
        pass


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
