"""Metal kernels for the Metal target: ``kernel.py`` renders a kernel as MSL, ``gemm.py`` the
simdgroup-matrix GEMM, ``schedule.py`` ranks threadgroup sizes and tiles, ``check.py``
type-checks MSL on any machine with clang. Whether Metal plans run here is
``luminal/metal.py``'s; running them in a host emulation, ``targets/metal_emu.py``'s."""
