"""CUDA kernels for the CUDA target: ``kernel.py`` renders a kernel (and picks its thread
mapping), ``gemm.py`` the tensor-core GEMM, ``nvrtc.py`` compiles them to cubins."""

from .kernel import (
    PRELUDE,
    CudaKernel,
    choose_schedule,
    compile_kernels,
    kernel_buffers,
    render_kernel,
    render_step,
)

__all__ = ["CudaKernel", "PRELUDE", "choose_schedule", "compile_kernels", "kernel_buffers",
           "render_kernel", "render_step"]  # fmt: skip
