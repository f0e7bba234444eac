"""The plan format from Python: round trips, expressions, validation, `show`."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from luminal.plan import (
    ALIGN,
    Copy,
    DType,
    FileWeight,
    InlineWeight,
    KernelFormat,
    Launch,
    LibCall,
    Op,
    Plan,
    PlanError,
    Postfix,
    Role,
    eval_program,
    pack_nibbles,
    program_of,
    render,
    unpack_nibbles,
)


class Sym:
    """A stand-in for the symbolic-shape module: anything with to_postfix()."""

    def __init__(self, items: list[tuple[int, int | str]]) -> None:
        self.items = items

    @staticmethod
    def dim(name: str) -> Sym:
        return Sym([(Op.DIM, name)])

    def _bin(self, other: Sym | int, op: Op) -> Sym:
        o = other if isinstance(other, Sym) else Sym([(Op.CONST, other)])
        return Sym(self.items + o.items + [(op, 0)])

    def __add__(self, o: Sym | int) -> Sym:
        return self._bin(o, Op.ADD)

    def __mul__(self, o: Sym | int) -> Sym:
        return self._bin(o, Op.MUL)

    def __floordiv__(self, o: Sym | int) -> Sym:
        return self._bin(o, Op.FLOORDIV)

    def to_postfix(self, dim_index: dict[str, int]) -> list[tuple[int, int]]:
        return [(int(op), dim_index[a] if op == Op.DIM else a) for op, a in self.items]  # type: ignore[index,misc]


def sample_plan() -> Plan:
    seq = Sym.dim("seq")
    p = Plan(backend="cpu", arch="x86_64", metadata={"model": "test", "ünï": "cödé"})
    p.add_dim("seq", 1, 128)
    p.add_dim("batch", 1, 4)
    x = p.add_buffer("x", DType.f32, Role.input, (Sym.dim("batch"), seq))
    w = p.add_buffer("w", "bf16", Role.weight, (3, 5))
    q = p.add_buffer("q", "i4", Role.weight, (7,))
    f = p.add_buffer("f", "f32", Role.weight, (2,))
    t = p.add_buffer("t", "f32", Role.scratch, (seq * 2,), offset=64)
    y = p.add_buffer("y", "f32", Role.output, (seq + 1,))
    k = p.add_kernel("k", KernelFormat.c_source, "k", "void k(void) {}")
    p.steps += [
        Launch(k, [x, t], grid=(seq // 2, 1, 1), block=(4, 1, 1)),
        LibCall("gemm", {"m": seq, "n": 4, "k": 4, "alpha": 0.5, "trans_b": 1}, [x, f, t]),
        Copy(y, t, seq * 4, 0, 8),
    ]
    p.weights += [
        InlineWeight(w, np.arange(15, dtype=np.uint16)),
        InlineWeight(q, np.array([1, -2, 3, -4, 5, -6, 7], dtype=np.int8).astype(np.uint8) & 0xF),
        FileWeight(f, "data/weights.bin", 128, 8),
    ]
    return p


def test_round_trip_is_byte_identical() -> None:
    # The i4 weight is given as 7 raw bytes: that is not its packed size.
    p = sample_plan()
    with pytest.raises(PlanError, match="'q'.*7 bytes given, buffer needs 4"):
        p.to_bytes()
    p.weights[1] = InlineWeight(2, pack_nibbles(np.array([1, 2, 3, 4, 5, 6, 7], np.uint8)))
    data = p.to_bytes()
    q = Plan.from_bytes(data)
    assert q.to_bytes() == data
    assert [d.name for d in q.dims] == ["seq", "batch"]
    assert q.metadata == p.metadata
    assert q.buffers[4].role == Role.scratch and q.buffers[4].offset == 64
    assert isinstance(q.steps[1], LibCall) and q.steps[1].fields["alpha"] == 0.5
    assert q.steps[1].fields["n"] == 4
    fw = q.weights[2]
    assert isinstance(fw, FileWeight) and (fw.path, fw.offset, fw.nbytes) == (
        "data/weights.bin",
        128,
        8,
    )


def test_layout_header_and_alignment(tmp_path) -> None:
    p = sample_plan()
    p.weights[1] = InlineWeight(2, pack_nibbles(np.arange(7, dtype=np.uint8)))
    path = tmp_path / "p.lmp"
    p.save(path)
    data = path.read_bytes()
    assert data == p.to_bytes()
    magic, version, size, blob, crc, reserved = struct.unpack("<4sIQQII", data[:32])
    assert (magic, version, size, reserved) == (b"LMPL", 2, len(data), 0)  # no variants: version 2
    assert blob % ALIGN == 0 and crc == zlib.crc32(data[32:])
    q = Plan.load(path)
    w = q.weights[0]
    assert isinstance(w, InlineWeight) and len(memoryview(w.data)) == 30


def test_symbolic_expressions_are_interned() -> None:
    p = sample_plan()
    p.weights[1] = InlineWeight(2, bytes(4))
    q = Plan.from_bytes(p.to_bytes())
    x, y = q.buffers[0], q.buffers[5]
    assert isinstance(x.shape[1], Postfix) and x.shape[1].program == ((Op.DIM, 0),)
    assert isinstance(y.nbytes, Postfix)
    assert y.nbytes.render(["seq", "batch"]) == "((seq + 1) * 4)"
    assert eval_program(y.nbytes.program, [9, 1]) == 40
    # x's nbytes is batch * seq * 4: two dims multiplied
    assert isinstance(x.nbytes, Postfix)
    assert eval_program(x.nbytes.program, [5, 3]) == 60


def test_packed_sizes() -> None:
    seq = Sym.dim("seq")
    p = Plan()
    p.add_dim("seq", 1, 100)
    p.add_buffer("a", "u4", Role.input, (seq, 3))
    q = Plan.from_bytes(p.to_bytes())
    nb = q.buffers[0].nbytes
    assert isinstance(nb, Postfix)
    assert [eval_program(nb.program, [s]) for s in (1, 2, 3)] == [2, 3, 5]


@pytest.mark.parametrize(
    "prog,dims,value",
    [
        ([(0, 7), (0, 2), (5, 0)], [], 3),
        ([(0, -7), (0, 2), (5, 0)], [], -4),
        ([(0, -7), (0, 2), (6, 0)], [], 1),
        ([(0, 7), (0, -2), (6, 0)], [], -1),
        ([(1, 0), (0, 3), (7, 0)], [5], 3),
        ([(1, 0), (0, 3), (8, 0)], [5], 5),
        ([(1, 0), (0, 3), (9, 0)], [2], 1),
        ([(1, 0), (0, 3), (10, 0)], [2], 0),
    ],
)
def test_eval_program_floor_semantics(prog, dims, value) -> None:
    assert eval_program(tuple(prog), dims) == value


def test_eval_program_errors() -> None:
    with pytest.raises(ZeroDivisionError):
        eval_program(((0, 1), (0, 0), (5, 0)))
    with pytest.raises(OverflowError):
        eval_program(((0, 2**62), (0, 4), (4, 0)))
    assert render(((1, 0), (0, 2), (7, 0)), ["seq"]) == "min(seq, 2)"


@pytest.mark.parametrize(
    "prog,msg",
    [
        ([(0, 1), (2, 0)], "underflow"),
        ([(0, 1), (0, 2)], "leaves 2 values"),
        ([(11, 0)], "unknown opcode"),
        ([(1, 5)], "DIM index 5"),
        ([(0, 1), (0, 1), (2, 3)], "operand of a binary op"),
    ],
)
def test_bad_programs_rejected_on_save(prog, msg) -> None:
    class Bad:
        def to_postfix(self, dim_index):
            return prog

    p = Plan()
    p.add_dim("seq", 1, 4)
    p.add_buffer("a", "f32", Role.input, (Bad(),))
    with pytest.raises(PlanError, match=msg):
        p.to_bytes()


def test_invalid_plans_rejected_on_save() -> None:
    p = Plan()
    p.add_buffer("a", "f32", Role.input, (4,))
    p.add_buffer("a", "f32", Role.output, (4,))
    with pytest.raises(PlanError, match="unique"):
        p.to_bytes()
    p = Plan()
    a = p.add_buffer("a", "f32", Role.input, (4,))
    p.steps.append(Launch(0, [a]))
    with pytest.raises(PlanError, match="kernel 0 out of range"):
        p.to_bytes()
    p = Plan()
    p.add_buffer("w", "f32", Role.weight, (4,))
    with pytest.raises(PlanError, match="without data"):
        p.to_bytes()
    p = Plan()
    a = p.add_buffer("a", "f32", Role.input, (4,))
    p.steps.append(Copy(a, a, 4))
    with pytest.raises(PlanError, match="copy into input"):
        p.to_bytes()
    with pytest.raises(PlanError, match="unknown dtype"):
        Plan().add_buffer("a", "f17", Role.input, (4,))
    with pytest.raises(PlanError, match="not an expression"):
        program_of("seq", {})  # type: ignore[arg-type]


def _sealed(data: bytearray) -> bytes:
    data[8:16] = struct.pack("<Q", len(data))
    data[24:28] = struct.pack("<I", zlib.crc32(bytes(data[32:])))
    return bytes(data)


def test_corrupt_files_raise_plan_error() -> None:
    good = Plan(dims=[], metadata={"a": "b"}).to_bytes()
    cases = {
        "bad magic": b"GGUF" + good[4:],
        "version 4 is not supported": good[:4] + struct.pack("<I", 4) + good[8:],
        "shorter than the header": good[:10],
        "truncated or has trailing": good[:-1],
        "checksum mismatch": good[:-1] + bytes([good[-1] ^ 1]),
        "count 1000 exceeds": _sealed(
            bytearray(
                good.replace(
                    b"\x01\x00\x00\x00\x01\x00\x00\x00a", b"\xe8\x03\x00\x00\x01\x00\x00\x00a"
                )
            )
        ),
    }
    for msg, data in cases.items():
        with pytest.raises(PlanError, match=msg):
            Plan.from_bytes(data)


def test_nibble_packing_round_trip() -> None:
    import ml_dtypes

    a = np.array([-8, -1, 0, 3, 7], dtype=ml_dtypes.int4)
    packed = pack_nibbles(a)
    assert packed.tolist() == [0xF8, 0x30, 0x07]
    back = unpack_nibbles(packed, 5, signed=True).view(ml_dtypes.int4)
    assert back.tolist() == a.tolist()


def test_show_cli(tmp_path) -> None:
    p = sample_plan()
    p.weights[1] = InlineWeight(2, bytes(4))
    path = tmp_path / "p.lmp"
    p.save(path)
    out = subprocess.run(
        [sys.executable, "-m", "luminal.plan", "show", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for needle in [
        "seq in [1, 128]",
        "scratch",
        "gemm(m=seq",
        "copy (seq * 4) bytes t+8 -> y+0",
        "data/weights.bin @ 128",
        "launch k grid=((seq // 2), 1, 1)",
    ]:
        assert needle in out.stdout, out.stdout
    path.write_bytes(b"nonsense")
    bad = subprocess.run(
        [sys.executable, "-m", "luminal.plan", "show", str(path)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "shorter than the header" in bad.stderr


def test_plan_module_imports_no_torch_or_graph() -> None:
    import ast
    import pathlib

    import luminal.plan

    for path in pathlib.Path(luminal.plan.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.startswith(("torch", "luminal")) for n in names), (path.name, names)
