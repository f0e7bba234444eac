"""What the GPU renderers (codegen/cuda/, codegen/metal/) share: ``kernel.py`` the thread
mappings, index types and group reductions over a backend's names (a ``Dialect``),
``gemm.py`` the gemm descriptor, tile loops and epilogue."""
