"""experts_int8: Mixture-of-Experts inference with int8 expert weights (W8A16) in one fused Triton kernel."""

from . import reference
from .ops import fused_experts, fused_moe
from .quant import dequantize_weights, quantize_weights
from .routing import select_experts

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "dequantize_weights",
    "fused_experts",
    "fused_moe",
    "quantize_weights",
    "reference",
    "select_experts",
]
