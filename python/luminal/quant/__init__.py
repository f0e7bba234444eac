"""Low-precision weights: requantizing models (``quantize``) and the formats they use.

The formats themselves (reference quantizers, numpy dequantizers, graph expressions) live with
the loaders that read them: GGUF block types in ``luminal.loaders.quants``, luminal's own
(fp8, int8, mxfp8, mxfp4, nvfp4, bf16, f16) in ``luminal.loaders.lowp``. ``luminal quantize``
is ``quant.cli``. See docs/quantization.md.
"""

from ..loaders.lowp import FORMATS
from .api import TYPES, QuantizeResult, describe, llama_cpp_reads, quantize

__all__ = ["FORMATS", "TYPES", "QuantizeResult", "describe", "llama_cpp_reads", "quantize"]
