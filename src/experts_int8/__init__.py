"""experts_int8: Mixture-of-Experts inference with int8 expert weights (W8A16) in one fused Triton kernel."""

from . import reference
from .ops import fused_experts, fused_moe
from .quant import dequantize_weights, quantize_weights
from .routing import select_experts

__version__ = "0.1.0"

# The transformers integration imports transformers: loaded on first use. Touching any of these names
# also registers quant_method "experts_int8" with transformers (needed to reload int8 checkpoints).
_TRANSFORMERS_EXPORTS = ("ExpertsInt8Config", "ExpertsInt8HfQuantizer", "quantize_")


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
