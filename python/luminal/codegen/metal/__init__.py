"""Metal kernels for the Metal target: ``kernel.py`` renders a kernel as MSL, ``gemm.py`` the
simdgroup-matrix GEMM, ``schedule.py`` ranks threadgroup sizes and tiles, ``check.py``
type-checks MSL on any machine with clang, ``device.py`` says whether Metal plans run here.
Nothing is imported here: ``luminal.metal_status()`` stays cheap."""
