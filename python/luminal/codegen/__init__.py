"""Code generation: kernel IR -> source. ``cstyle.py`` is the C-style emitter every backend
shares (with ``prelude.py``, the helpers their kernels share); ``cpu/`` renders C for the CPU
target, ``cuda/`` CUDA C compiled by NVRTC."""
