"""C kernels for the CPU target: ``kernel.py`` renders a kernel; ``rows.py`` (row caches,
prefetch, streaming stores), ``vector.py`` (explicit-vector sums) and ``attention.py`` (the
blocked online-softmax kernel) are the forms it picks by the shape of the IR."""

from .kernel import PRELUDE, CKernel, render_kernel

__all__ = ["CKernel", "PRELUDE", "render_kernel"]
