"""Weight files: safetensors (own header parse, mapped) and GGUF (the ``gguf`` package, with
block quantizations as graph expressions)."""

from .safetensors import SafetensorsError, SafetensorsFile, load_safetensors, save_safetensors

__all__ = ["SafetensorsError", "SafetensorsFile", "load_safetensors", "save_safetensors"]
