"""What the GPU gemm renderers share: the descriptor, the tile loops over C, the operand
tiles' thread-to-element map and the bounds-checked epilogue.

The descriptor is the one the search writes (compiler/search/gemm.py) and the CPU backend
runs: row-major ``C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`` for ``b < batch``, with
leading dimensions, batch strides and element offsets as expressions over plan dims. A group
computes a BM x BN tile of C; grid x runs over N tiles, y over M tiles, z over the batch (y
and z stride when they exceed 65535), so M, N, K and the batch may be anything (odd, 0,
symbolic). How a tile is multiplied is the backend's (mma.sync fragments, simdgroup matrices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ..cstyle import cexpr, store_stmt
from .kernel import Dialect

MAX_GRID_YZ = 65535
OPERAND_DTYPES = (dt.f32, dt.f16, dt.bf16)
OUTPUT_DTYPES = (dt.f32, dt.f16, dt.bf16)
# descriptor field -> the variable the kernel holds it in
_VARS = (("m", "M"), ("n", "N"), ("k", "K"), ("lda", "LDA"), ("ldb", "LDB"), ("ldc", "LDC"),
         ("batch", "BATCH"), ("stride_a", "SA"), ("stride_b", "SB"), ("stride_c", "SC"),
         ("a_offset", "OA"), ("b_offset", "OB"), ("c_offset", "OC"))  # fmt: skip
_INT_FIELDS = tuple(name for name, _ in _VARS)


def gemm_fields(lc: K.LibCall) -> dict[str, sint | float]:
    """The descriptor with the CPU backend's defaults filled in (packed row-major)."""
    f = dict(lc.fields)
    unknown = set(f) - set(_INT_FIELDS) - {"trans_a", "trans_b", "alpha", "beta"}
    if unknown:
        raise ValueError(f"gemm {lc.name}: unknown descriptor fields {sorted(unknown)}")
    for req in ("m", "n", "k"):
        if req not in f:
            raise ValueError(f"gemm {lc.name}: descriptor lacks {req!r}")
    for t in ("trans_a", "trans_b"):
        v = f.get(t, 0)
        if v not in (0, 1):
            raise ValueError(f"gemm {lc.name}: {t} must be 0 or 1, got {v!r}")
        f[t] = int(v)
    m, n, k = f["m"], f["n"], f["k"]
    f.setdefault("lda", m if f["trans_a"] else k)
    f.setdefault("ldb", k if f["trans_b"] else n)
    f.setdefault("ldc", n)
    f.setdefault("batch", 1)
    for name in ("stride_a", "stride_b", "stride_c", "a_offset", "b_offset", "c_offset"):
        f.setdefault(name, 0)
    f.setdefault("alpha", 1.0)
    f.setdefault("beta", 0.0)
    for name in ("alpha", "beta"):
        if not isinstance(f[name], (int, float)):
            raise ValueError(f"gemm {lc.name}: {name} must be a number, not {f[name]!r}")
    for name in _INT_FIELDS:
        if isinstance(f[name], float):
            raise ValueError(f"gemm {lc.name}: field {name!r} must be an integer expression")
    return f


def supports(lc: K.LibCall, dtypes: Mapping[int, dt.DType]) -> str | None:
    """None when a generated GPU gemm can run ``lc``, else why not."""
    if lc.func != "gemm":
        return f"no generated kernel for library function {lc.func!r}"
    if len(lc.args) != 3:
        return "gemm needs 3 buffers (A, B, C)"
    a, b, c = (dtypes[x] for x in lc.args)
    if a is not b or a not in OPERAND_DTYPES:
        return f"operands {a.name} x {b.name} (need both f32, f16 or bf16)"
    if c not in OUTPUT_DTYPES:
        return f"output {c.name}"
    try:
        gemm_fields(lc)
    except ValueError as e:
        return str(e)
    return None


@dataclass
class GemmCall:
    """A gemm call a generated kernel can run: its descriptor (defaults filled in), its
    buffers and their dtypes."""

    fields: dict[str, sint | float]
    a: int
    b: int
    c: int
    operand: dt.DType
    out: dt.DType
    alpha: float
    beta: float


def prepare(lc: K.LibCall, dtypes: Mapping[int, dt.DType], kind: str) -> GemmCall:
    """``lc`` checked for a generated ``kind`` kernel (a clear error naming it otherwise)."""
    why = supports(lc, dtypes)
    if why is not None:
        raise ValueError(f"gemm {lc.name}: cannot generate a {kind} kernel: {why}")
    f = gemm_fields(lc)
    a, b, c = lc.args
    alpha, beta = float(f["alpha"]), float(f["beta"])  # type: ignore[arg-type]
    return GemmCall(f, a, b, c, dtypes[a], dtypes[c], alpha, beta)


def _c(e: sint | float) -> str:
    return cexpr(e)  # type: ignore[arg-type]


def field_lines(f: Mapping[str, sint | float]) -> list[str]:
    """The descriptor's integer fields as the kernel's variables (M, N, K, LDA, ...)."""
    return [f"  const int64_t {var} = (int64_t)({_c(f[name])});" for name, var in _VARS]


def tile_loops(d: Dialect, bm: int, bn: int, operand: str, out: str) -> list[str]:
    """The loops over this group's tiles of C (batch z, M tiles y; x is the N tile), with
    ``m0`` and ``n0`` the tile's first row and column and ``A``, ``B``, ``C`` this batch's
    matrices (element types ``operand`` and ``out``); the caller closes one brace."""
    g = d.global_
    return [f"  const int64_t tiles_m = (M + {bm - 1}) / {bm};",
            f"  const int64_t n0 = (int64_t){d.group}.x * {bn};",
            f"  for (int64_t bz = {d.group}.z; bz < BATCH; bz += {d.groups}.z)",
            f"  for (int64_t by = {d.group}.y; by < tiles_m; by += {d.groups}.y) {{",
            f"    const int64_t m0 = by * {bm};",
            f"    {g}const {operand} *A = b1 + OA + bz * SA;",
            f"    {g}const {operand} *B = b2 + OB + bz * SB;",
            f"    {g}{out} *C = b0 + OC + bz * SC;"]  # fmt: skip


def operand_map(
    f: Mapping[str, sint | float], operand: str, outer: int, bk: int
) -> tuple[str, str, str, str]:
    """For tile element ``e`` of operand ``A`` (outer axis m) or ``B`` (outer axis n): the
    expressions of ``r`` (its outer index) and ``c`` (its k index), the bounds check and the
    global address, in terms of ``r`` and ``c``. Neighbouring ``e`` follow the operand's
    contiguous axis in global memory, so neighbouring threads read neighbouring addresses."""
    ld, o0, lim = ("LDA", "m0", "M") if operand == "A" else ("LDB", "n0", "N")
    k_contiguous = f["trans_a"] == 0 if operand == "A" else f["trans_b"] == 1
    ok = f"{o0} + r < {lim} && k0 + c < K"
    if k_contiguous:  # stored [outer][k]
        return f"e / {bk}", f"e % {bk}", ok, f"({o0} + r) * {ld} + k0 + c"
    return f"e % {outer}", f"e / {outer}", ok, f"(k0 + c) * {ld} + {o0} + r"  # [k][outer]


def epilogue(acc: str, alpha: float, beta: float, cdt: dt.DType, ind: str) -> list[str]:
    """Store ``alpha * acc + beta * C`` at (r, c) of the tile when it is inside C."""
    out = [f"{ind}if (r >= M || c >= N) continue;",
           f"{ind}float v = {acc}{'' if alpha == 1.0 else f' * {alpha!r}f'};"]  # fmt: skip
    if beta != 0.0:
        old = {dt.f32: "C[r * LDC + c]", dt.f16: "lm_f16_to_f32(C[r * LDC + c])",
               dt.bf16: "lm_bf16_to_f32(C[r * LDC + c])"}[cdt]  # fmt: skip
        out.append(f"{ind}v += {beta!r}f * {old};")
    out.append(ind + store_stmt("C", "r * LDC + c", "v", cdt))
    return out


def grid(f: Mapping[str, sint | float], bm: int, bn: int) -> tuple[sint, sint, sint]:
    m, n, batch = f["m"], f["n"], f["batch"]
    return (
        sym.ceildiv(n, bn),  # type: ignore[arg-type]
        sym.minimum(sym.ceildiv(m, bm), MAX_GRID_YZ),  # type: ignore[arg-type]
        sym.minimum(batch, MAX_GRID_YZ),  # type: ignore[arg-type]
    )
