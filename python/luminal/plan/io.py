"""Plan bytes: the writer, the validating reader and the readable dump (``model.py`` holds
the data model, ``docs/plan-format.md`` the layout)."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO, TypeVar

import numpy as np

from .model import (
    ALIGN,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    NONE,
    READ_VERSIONS,
    Buffer,
    Copy,
    Dim,
    DType,
    Expr,
    FileWeight,
    InlineWeight,
    Kernel,
    KernelFormat,
    Launch,
    LibCall,
    PlanData,
    PlanError,
    Postfix,
    Program,
    Role,
    SupportsPostfix,
    _const,
    _nbytes_program,
    _weight_bytes,
    check_program,
    program_of,
)

P = TypeVar("P", bound=PlanData)

# ---- writing -------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def u8(self, v: int) -> None:
        self.buf += struct.pack("<B", v)

    def u32(self, v: int) -> None:
        self.buf += struct.pack("<I", v)

    def u64(self, v: int) -> None:
        self.buf += struct.pack("<Q", v)

    def i64(self, v: int) -> None:
        self.buf += struct.pack("<q", v)

    def f64(self, v: float) -> None:
        self.buf += struct.pack("<d", v)

    def text(self, s: str) -> None:
        b = s.encode()
        self.u32(len(b))
        self.buf += b


class _Exprs:
    """Interns programs: equal programs share one id."""

    def __init__(self, plan: PlanData) -> None:
        self.dim_index = {d.name: i for i, d in enumerate(plan.dims)}
        self.ids: dict[Program, int] = {}

    def add_program(self, p: Program, what: str) -> int:
        if p not in self.ids:
            check_program(p, len(self.dim_index), what)
            self.ids[p] = len(self.ids)
        return self.ids[p]

    def __call__(self, e: Expr, what: str) -> int:
        return self.add_program(program_of(e, self.dim_index), what)


def _serialize(plan: PlanData) -> Iterator[bytes | memoryview]:
    """Yields the header, the body, padding, then each inline weight (with padding)."""
    body, blob = _body(plan)
    blob_offset = _align(HEADER_SIZE + len(body))
    pad = bytes(blob_offset - HEADER_SIZE - len(body))
    chunks: list[bytes | memoryview] = [body, pad]
    pos = 0
    for off, data in blob:
        chunks += [bytes(off - pos), data]
        pos = off + len(data)
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    size = blob_offset + pos
    yield MAGIC + struct.pack("<IQQII", _version(plan), size, blob_offset, crc, 0)
    yield from chunks


def _version(plan: PlanData) -> int:
    """The oldest layout that holds ``plan``: version 3 only for step conditions (variants),
    so a plan without them stays readable by runtimes that read version 2."""
    return FORMAT_VERSION if any(s.when is not None for s in plan.steps) else 2


def _write(plan: PlanData, f: BinaryIO) -> None:
    for chunk in _serialize(plan):
        f.write(chunk)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _body(plan: PlanData) -> tuple[bytes, list[tuple[int, memoryview]]]:
    ex = _Exprs(plan)
    w = _Writer()
    n_buf, n_ker = len(plan.buffers), len(plan.kernels)

    def buf_id(b: int, what: str) -> int:
        if not (isinstance(b, int) and 0 <= b < n_buf):
            raise PlanError(f"{what}: buffer {b!r} out of range ({n_buf} buffers)")
        return b

    w.text(plan.backend)
    w.text(plan.arch)
    w.u32(len(plan.dims))
    names = set()
    for d in plan.dims:
        if not d.name or d.name in names or not 0 <= d.min <= d.max:
            raise PlanError(f"dim {d.name!r}: name empty/repeated or bad range")
        names.add(d.name)
        w.text(d.name)
        w.i64(d.min)
        w.i64(d.max)

    # Expressions are interned while encoding the rest, so the table is written afterwards.
    rest = _Writer()
    rest.u32(n_buf)
    io_names: set[str] = set()
    for b in plan.buffers:
        what = f"buffer {b.name!r}"
        if b.role in (Role.input, Role.output):
            if not b.name or b.name in io_names:
                raise PlanError(f"{what}: input/output names must be unique and non-empty")
            io_names.add(b.name)
        if len(b.shape) > 32:
            raise PlanError(f"{what}: rank {len(b.shape)} > 32")
        rest.text(b.name)
        rest.u8(b.dtype)
        rest.u8(b.role)
        rest.u8(len(b.shape))
        shape = [program_of(d, ex.dim_index) for d in b.shape]
        for prog in shape:
            rest.u32(ex.add_program(prog, f"{what} shape"))
        nb = _nbytes_program(b.dtype, shape) if b.nbytes is None else None
        rest.u32(ex.add_program(nb, what) if nb else ex(b.nbytes, f"{what} nbytes"))  # type: ignore[arg-type]
        if b.role == Role.scratch:
            rest.u32(ex(b.offset if b.offset is not None else 0, f"{what} offset"))
        else:
            if b.offset is not None:
                raise PlanError(f"{what}: only scratch buffers have an arena offset")
            rest.u32(NONE)
        rest.u32(NONE if b.alias is None else b.alias)
    _check_aliases(plan.buffers, lambda e: program_of(e, ex.dim_index))

    rest.u32(n_ker)
    for k in plan.kernels:
        rest.text(k.name)
        rest.u8(k.format)
        rest.text(k.entry)
        rest.u64(len(k.code))
        rest.buf += k.code

    version = _version(plan)
    rest.u32(len(plan.steps))
    for i, s in enumerate(plan.steps):
        what = f"step {i}"
        if isinstance(s, Launch):
            if not 0 <= s.kernel < n_ker:
                raise PlanError(f"{what}: kernel {s.kernel} out of range ({n_ker} kernels)")
            rest.u8(0)
            rest.u32(s.kernel)
            for e in (*s.grid, *s.block, s.shared_mem):
                rest.u32(ex(e, what))
            rest.u32(len(s.args))
            for a in s.args:
                rest.u32(buf_id(a, what))
        elif isinstance(s, LibCall):
            rest.u8(1)
            rest.text(s.func)
            rest.u32(len(s.fields))
            for name, v in s.fields.items():
                rest.text(name)
                if isinstance(v, (float, np.floating)):
                    rest.u8(1)
                    rest.f64(float(v))
                else:
                    rest.u8(0)
                    rest.u32(ex(v, f"{what} field {name!r}"))
            rest.u32(len(s.args))
            for a in s.args:
                rest.u32(buf_id(a, what))
        elif isinstance(s, Copy):
            rest.u8(2)
            rest.u32(buf_id(s.dst, what))
            rest.u32(buf_id(s.src, what))
            if plan.buffers[s.dst].role in (Role.input, Role.weight):
                raise PlanError(f"{what}: copy into {plan.buffers[s.dst].role.name} buffer")
            for e in (s.nbytes, s.dst_offset, s.src_offset):
                rest.u32(ex(e, what))
        else:
            raise PlanError(f"{what}: not a step: {s!r}")
        if version >= 3:
            rest.u32(NONE if s.when is None else ex(s.when, f"{what} condition"))

    blob: list[tuple[int, memoryview]] = []
    pos = 0
    rest.u32(len(plan.weights))
    sourced: set[int] = set()
    for wt in plan.weights:
        bid = buf_id(wt.buffer, "weight")
        buf = plan.buffers[bid]
        what = f"weight {buf.name!r}"
        if buf.role != Role.weight or bid in sourced:
            raise PlanError(f"{what}: not a weight buffer, or given twice")
        sourced.add(bid)
        shape = [program_of(d, ex.dim_index) for d in buf.shape]
        want_p = _nbytes_program(buf.dtype, shape) if buf.nbytes is None else None
        want = _const(want_p or program_of(buf.nbytes, ex.dim_index))  # type: ignore[arg-type]
        rest.u32(bid)
        if isinstance(wt, InlineWeight):
            data = _weight_bytes(wt, buf)
            if want != len(data):
                raise PlanError(f"{what}: {len(data)} bytes given, buffer needs {want}")
            rest.u8(0)
            rest.text("")
            rest.u64(pos)
            rest.u64(len(data))
            blob.append((pos, data))
            pos = _align(pos + len(data))
        else:
            if want != wt.nbytes or not wt.path:
                raise PlanError(f"{what}: {wt.nbytes} bytes in {wt.path!r}, buffer needs {want}")
            rest.u8(1)
            rest.text(os.fspath(wt.path))
            rest.u64(wt.offset)
            rest.u64(wt.nbytes)
    missing = [
        b.name for i, b in enumerate(plan.buffers) if b.role == Role.weight and i not in sourced
    ]
    if missing:
        raise PlanError(f"weights without data: {missing}")

    rest.u32(len(plan.metadata))
    for key, value in plan.metadata.items():
        rest.text(key)
        rest.text(value)

    w.u32(len(ex.ids))
    for prog in ex.ids:
        w.u32(len(prog))
        for op, arg in prog:
            w.u8(op)
            w.i64(arg)
    return bytes(w.buf + rest.buf), blob


def _check_aliases(buffers: list[Buffer], prog: Any) -> None:
    """An alias makes an output share its input's memory: it must name an input of the same
    dtype, shape and size, and each input may be updated by one output only."""
    taken: set[int] = set()
    for b in buffers:
        if b.alias is None:
            continue
        what = f"buffer {b.name!r}"
        a = b.alias
        if b.role != Role.output:
            raise PlanError(f"{what}: only outputs can alias (update) an input")
        if not (isinstance(a, int) and 0 <= a < len(buffers)) or buffers[a].role != Role.input:
            raise PlanError(f"{what}: alias {a!r} is not an input buffer")
        t = buffers[a]
        same_shape = [prog(x) for x in b.shape] == [prog(x) for x in t.shape]
        sizes = [_nbytes_program(x.dtype, [prog(d) for d in x.shape]) if x.nbytes is None
                 else prog(x.nbytes) for x in (b, t)]  # fmt: skip
        if b.dtype != t.dtype or not same_shape or sizes[0] != sizes[1]:
            raise PlanError(f"{what}: updates input {t.name!r} of a different dtype/shape/size")
        if a in taken:
            raise PlanError(f"{what}: input {t.name!r} is updated by two outputs")
        taken.add(a)


# ---- reading -------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: memoryview, end: int) -> None:
        self.d, self.pos, self.end = data, HEADER_SIZE, end
        self.section = "header"

    def take(self, n: int) -> memoryview:
        if n > self.end - self.pos:
            raise PlanError(f"section {self.section!r} is truncated at byte {self.pos}")
        v = self.d[self.pos : self.pos + n]
        self.pos += n
        return v

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u8(self) -> int:
        return int(self.unpack("<B"))

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def i64(self) -> int:
        return int(self.unpack("<q"))

    def text(self) -> str:
        return bytes(self.take(self.u32())).decode()

    def count(self, min_size: int) -> int:
        n = self.u32()
        if n * min_size > self.end - self.pos:
            raise PlanError(f"section {self.section!r}: count {n} exceeds the file")
        return n

    def id(self, limit: int, what: str) -> int:
        v = self.u32()
        if v >= limit:
            raise PlanError(f"section {self.section!r}: {what} {v} out of range ({limit})")
        return v


def _parse(d: memoryview, plan: P) -> P:
    """Fills the empty ``plan`` from bytes ``d``."""
    n = len(d)
    if n < HEADER_SIZE:
        raise PlanError(f"not a luminal plan: {n} bytes is shorter than the header (truncated?)")
    if bytes(d[:4]) != MAGIC:
        raise PlanError("not a luminal plan: bad magic (expected 'LMPL' at byte 0)")
    version, size, blob_offset, crc, reserved = struct.unpack("<IQQII", d[4:HEADER_SIZE])
    if version not in READ_VERSIONS:
        raise PlanError(
            f"plan format version {version} is not supported (this luminal reads versions "
            f"{READ_VERSIONS[0]} to {READ_VERSIONS[-1]}); recompile the model"
        )
    if size != n:
        raise PlanError(f"plan is truncated or has trailing bytes: header says {size}, got {n}")
    if not HEADER_SIZE <= blob_offset <= n or blob_offset % ALIGN or reserved:
        raise PlanError(f"plan header is corrupt (blob offset {blob_offset})")
    if zlib.crc32(d[HEADER_SIZE:]) != crc:
        raise PlanError("plan checksum mismatch: the file is corrupt")

    r = _Reader(d, blob_offset)
    r.section = "target"
    plan.backend, plan.arch = r.text(), r.text()
    r.section = "dims"
    plan.dims = [Dim(r.text(), r.i64(), r.i64()) for _ in range(r.count(20))]
    r.section = "exprs"
    exprs: list[Expr] = []
    for i in range(r.count(4)):
        p = tuple((r.u8(), r.i64()) for _ in range(r.count(9)))
        check_program(p, len(plan.dims), f"expression #{i}")
        c = _const(p)
        exprs.append(c if c is not None else Postfix(p))

    def expr(what: str) -> Expr:
        return exprs[r.id(len(exprs), what)]

    r.section = "buffers"
    for _ in range(r.count(19 if version >= 2 else 15)):
        name, dt, role = r.text(), r.u8(), r.u8()
        if dt >= len(DType) or role >= len(Role):
            raise PlanError(f"buffer {name!r}: unknown dtype {dt} or role {role}")
        shape = tuple(expr("shape expression") for _ in range(r.u8()))
        nbytes = expr("nbytes expression")
        off = r.u32()
        if (off == NONE) != (role != Role.scratch) or (off != NONE and off >= len(exprs)):
            raise PlanError(f"buffer {name!r}: bad arena offset expression {off}")
        alias = r.u32() if version >= 2 else NONE
        plan.buffers.append(
            Buffer(name, DType(dt), Role(role), shape, nbytes,
                   None if off == NONE else exprs[off], None if alias == NONE else alias)
        )  # fmt: skip
    n_buf = len(plan.buffers)
    _check_aliases(plan.buffers, lambda e: program_of(e, {}))
    r.section = "kernels"
    for _ in range(r.count(17)):
        name, fmt, entry = r.text(), r.u8(), r.text()
        if fmt >= len(KernelFormat):
            raise PlanError(f"kernel {name!r}: unknown format {fmt}")
        plan.kernels.append(Kernel(name, KernelFormat(fmt), entry, bytes(r.take(r.u64()))))
    r.section = "steps"
    for _ in range(r.count(1)):
        kind = r.u8()
        if kind == 0:
            k = r.id(len(plan.kernels), "kernel")
            g = [expr("launch expression") for _ in range(7)]
            args = [r.id(n_buf, "buffer") for _ in range(r.count(4))]
            plan.steps.append(Launch(k, args, (g[0], g[1], g[2]), (g[3], g[4], g[5]), g[6]))
        elif kind == 1:
            func = r.text()
            fields: dict[str, Expr | float] = {}
            for _ in range(r.count(6)):
                fname, fkind = r.text(), r.u8()
                if fkind > 1 or fname in fields:
                    raise PlanError(f"libcall {func!r}: bad field {fname!r}")
                fields[fname] = float(r.unpack("<d")) if fkind else expr("field expression")
            args = [r.id(n_buf, "buffer") for _ in range(r.count(4))]
            plan.steps.append(LibCall(func, fields, args))
        elif kind == 2:
            dst, src = r.id(n_buf, "buffer"), r.id(n_buf, "buffer")
            plan.steps.append(Copy(dst, src, expr("nbytes"), expr("offset"), expr("offset")))
        else:
            raise PlanError(f"unknown step kind {kind}")
        if version >= 3:
            when = r.u32()
            if when != NONE:
                if when >= len(exprs):
                    raise PlanError(f"step {len(plan.steps) - 1}: condition {when} out of range")
                plan.steps[-1].when = exprs[when]
    r.section = "weights"
    blob = d[blob_offset:]
    for _ in range(r.count(25)):
        b, kind, path, off, nbytes = r.id(n_buf, "buffer"), r.u8(), r.text(), r.u64(), r.u64()
        if plan.buffers[b].role != Role.weight or kind > 1:
            raise PlanError(f"weight source for buffer {b} is invalid")
        if kind == 0:
            if off % ALIGN or off + nbytes > len(blob):
                raise PlanError(f"inline weight {plan.buffers[b].name!r} lies outside the blob")
            plan.weights.append(InlineWeight(b, blob[off : off + nbytes]))
        else:
            plan.weights.append(FileWeight(b, path, off, nbytes))
    r.section = "metadata"
    plan.metadata = {r.text(): r.text() for _ in range(r.count(8))}
    if any(bytes(d[r.pos : blob_offset])):
        raise PlanError("plan has unexpected bytes after the metadata section")
    return plan


# ---- describe ------------------------------------------------------------------------------


def _describe(plan: PlanData) -> str:
    names = [d.name for d in plan.dims]

    def e(x: Expr | float | None) -> str:
        if isinstance(x, Postfix):
            return x.render(names)
        if isinstance(x, SupportsPostfix):
            return str(x)
        return repr(x)

    def bname(i: int) -> str:
        return plan.buffers[i].name or f"#{i}"

    lines = [f"luminal plan (format {_version(plan)}) for {plan.backend} {plan.arch}".rstrip()]
    lines.append(f"dims ({len(plan.dims)}):")
    lines += [f"  {d.name} in [{d.min}, {d.max}]" for d in plan.dims]
    lines.append(f"buffers ({len(plan.buffers)}):")
    for i, b in enumerate(plan.buffers):
        shape = ", ".join(e(s) for s in b.shape)
        extra = f" at arena+{e(b.offset)}" if b.role == Role.scratch else ""
        if b.alias is not None:
            extra = f" in place of input {bname(b.alias)}"
        lines.append(
            f"  #{i:<3} {b.role.name:<7} {b.dtype.name:<7} {b.name} [{shape}] "
            f"{e(b.nbytes)} bytes{extra}"
        )
    lines.append(f"kernels ({len(plan.kernels)}):")
    for i, k in enumerate(plan.kernels):
        lines.append(f"  #{i:<3} {k.name} ({k.format.name}, entry {k.entry}, {len(k.code)} bytes)")
    lines.append(f"steps ({len(plan.steps)}):")
    for i, s in enumerate(plan.steps):
        if isinstance(s, Launch):
            args = ", ".join(bname(a) for a in s.args)
            lines.append(
                f"  {i:<4} launch {plan.kernels[s.kernel].name} "
                f"grid=({', '.join(e(g) for g in s.grid)}) "
                f"block=({', '.join(e(g) for g in s.block)}) args=[{args}]"
            )
        elif isinstance(s, LibCall):
            fields = ", ".join(f"{k}={e(v)}" for k, v in s.fields.items())
            args = ", ".join(bname(a) for a in s.args)
            lines.append(f"  {i:<4} {s.func}({fields}) args=[{args}]")
        else:
            lines.append(
                f"  {i:<4} copy {e(s.nbytes)} bytes {bname(s.src)}+{e(s.src_offset)} -> "
                f"{bname(s.dst)}+{e(s.dst_offset)}"
            )
        if s.when is not None:
            lines[-1] += f" when {e(s.when)}"
    lines.append(f"weights ({len(plan.weights)}):")
    for wt in plan.weights:
        if isinstance(wt, InlineWeight):
            d = wt.data
            size = d.nbytes if isinstance(d, np.ndarray) else len(memoryview(d).cast("B"))
            lines.append(f"  {bname(wt.buffer)}: inline, {size} bytes")
        else:
            lines.append(f"  {bname(wt.buffer)}: {wt.path} @ {wt.offset}, {wt.nbytes} bytes")
    if plan.metadata:
        lines.append("metadata:")
        lines += [f"  {k}: {v}" for k, v in plan.metadata.items()]
    return "\n".join(lines)
