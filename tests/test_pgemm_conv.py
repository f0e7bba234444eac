"""pgemm's implicit convolution (csrc/cpu/pgemm_conv.inc): the patches operand of a
convolution's product read through the descriptor's conv_* geometry straight from the image,
in the plain form (B's panels) and the swapped one (A's tiles), against PyTorch's conv2d at odd
sizes; the descriptor's errors; the search recognizing a patch copy and keeping the call."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal import runtime
from luminal.codegen.cpu.jam import vector_registers
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search import gemm, select
from luminal.compiler.search.conv import implicit_conv
from luminal.compiler.search.tuner import Timing, Tuner, clear_memory_cache
from luminal.graph import symbolic as sym
from luminal.graph.ops import Op
from luminal.plan import InlineWeight, LibCall, Plan, Role
from luminal.targets.cpu import CpuTarget

AVX512 = vector_registers() == 32


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _out_size(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


def _conv_plan(b: int, c: int, h: int, w: int, co: int, k: int, s: int, p: int,
               fields: dict, wv: np.ndarray) -> Plan:  # fmt: skip
    """C[i] = W @ patches(x[i]) with the patches read through conv_* (W the plan's weight)."""
    oh, ow = _out_size(h, k, s, p), _out_size(w, k, s, p)
    plan = Plan()
    x = plan.add_buffer("x", "f32", Role.input, (b, c, h, w))
    wb = plan.add_buffer("w", "f32", Role.weight, (co, c * k * k))
    out = plan.add_buffer("y", "f32", Role.output, (b, co, oh, ow))
    plan.weights.append(InlineWeight(wb, wv.reshape(co, c * k * k)))
    desc = {"m": co, "n": oh * ow, "k": c * k * k, "batch": b, "stride_a": 0,
            "stride_b": c * h * w, "stride_c": co * oh * ow, "conv_c": c, "conv_kh": k,
            "conv_kw": k, "conv_ow": ow, "conv_sh": s, "conv_sw": s, "conv_ph": p,
            "conv_pw": p, "conv_ih": h, "conv_iw": w, **fields}  # fmt: skip
    plan.steps.append(LibCall("pgemm", desc, [wb, x, out]))
    return plan


FORMS = {
    "plain": {"mr": 12, "pack": 0, "pack_a": 0},
    "swap": {"mr": 12, "swap": 1, "pack": 1, "pack_a": 1},
    "swap-mr5-kc7": {"mr": 5, "mc": 10, "kc": 7, "swap": 1, "pack": 1, "pack_a": 1},
}
GEOMETRIES = [
    # batch, channels, height, width, out channels, kernel, stride, padding
    (1, 3, 9, 11, 5, 3, 1, 1),
    (3, 17, 7, 13, 19, 3, 2, 1),
    (1, 5, 16, 16, 33, 1, 1, 0),
    (3, 6, 9, 8, 7, 1, 2, 0),
    (1, 3, 23, 19, 10, 7, 2, 3),
    (3, 9, 12, 5, 11, 7, 1, 3),
    (1, 18, 6, 6, 4, 3, 1, 0),
    (3, 2, 40, 3, 37, 3, 2, 3),
]


@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "-".join(map(str, g)))
def test_implicit_conv_matches_torch(geo: tuple, form: str, isa: str, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    b, c, h, w, co, k, s, p = geo
    wv = rand(co, c, k, k, seed=1)
    ex = runtime.load(_conv_plan(b, c, h, w, co, k, s, p, FORMS[form], wv))
    for seed in (2, 3):  # twice: the packed weight is reused
        xv = rand(b, c, h, w, seed=seed)
        want = TF.conv2d(torch.from_numpy(xv), torch.from_numpy(wv), stride=s, padding=p)
        np.testing.assert_allclose(ex.run({"x": xv})["y"], want.numpy(), rtol=1e-4, atol=1e-4)


def test_implicit_conv_strided_views() -> None:
    """An image inside a larger buffer: channel and row strides, an offset, a batch stride."""
    b, c, h, w, co, k = 2, 4, 6, 7, 5, 3
    big = rand(b, c + 1, h + 2, w + 3, seed=4)
    wv = rand(co, c, k, k, seed=5)
    plan = Plan()
    x = plan.add_buffer("x", "f32", Role.input, big.shape)
    wb = plan.add_buffer("w", "f32", Role.weight, (co, c * k * k))
    out = plan.add_buffer("y", "f32", Role.output, (b, co, h, w))
    plan.weights.append(InlineWeight(wb, wv.reshape(co, -1)))
    cs, rs = (h + 2) * (w + 3), w + 3
    desc = {"m": co, "n": h * w, "k": c * k * k, "batch": b, "stride_a": 0,
            "stride_b": (c + 1) * cs, "b_offset": cs + rs + 2, "stride_c": co * h * w,
            "conv_c": c, "conv_kh": k, "conv_kw": k, "conv_ow": w, "conv_ph": 1, "conv_pw": 1,
            "conv_ih": h, "conv_iw": w, "conv_cs": cs, "conv_rs": rs}  # fmt: skip
    plan.steps.append(LibCall("pgemm", desc, [wb, x, out]))
    got = runtime.load(plan).run({"x": big})["y"]
    img = big[:, 1 : c + 1, 1 : h + 1, 2 : w + 2]
    want = TF.conv2d(torch.from_numpy(np.ascontiguousarray(img)), torch.from_numpy(wv), padding=1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"conv_c": 4}, "k 45 is not conv_c \\* conv_kh \\* conv_kw"),
     ({"conv_ow": 4}, "n 35 is not a multiple of conv_ow"),
     ({"conv_sh": 0}, "must be 1.."), ({"conv_ph": -1}, "must be 0.."),
     ({"conv_ih": 9}, "the image reaches outside its buffer"),
     ({"trans_b": 1, "ldb": 45}, "needs trans_b 0"),
     ({"pack": 1}, "B needs 'pack' 0"),
     ({"swap": 1, "pack_a": 0}, "'swap' 1 needs 'pack_a' 1")],
)  # fmt: skip
def test_implicit_conv_rejects_bad_geometry(fields: dict, message: str) -> None:
    plan = _conv_plan(1, 5, 7, 5, 3, 3, 1, 1, {}, rand(3, 5, 3, 3))
    plan.steps[0] = LibCall("pgemm", {**plan.steps[0].fields, **fields}, plan.steps[0].args)
    ex = runtime.load(plan)
    with pytest.raises(runtime.PlanError, match=f"step 0 \\(pgemm\\): .*{message}"):
        ex.run({"x": rand(1, 5, 7, 5)})


def test_conv_fields_are_pgemm_only() -> None:
    plan = _conv_plan(1, 5, 7, 5, 3, 3, 1, 1, {}, rand(3, 5, 3, 3))
    plan.steps[0] = LibCall("gemm", plan.steps[0].fields, plan.steps[0].args)
    with pytest.raises(runtime.PlanError, match="'conv_c' \\(an implicit convolution\\) is taken "
                       "by pgemm only"):  # fmt: skip
        runtime.load(plan)
    plan.steps[0] = LibCall("pgemm", {k: v for k, v in plan.steps[0].fields.items()
                                      if k != "conv_iw"}, plan.steps[0].args)  # fmt: skip
    with pytest.raises(runtime.PlanError, match="implicit convolution lacks field 'conv_iw'"):
        runtime.load(plan)


# ---- the search


def _prefer_implicit(monkeypatch, tmp_path) -> list[K.Kernel | K.LibCall]:
    """Makes every compile's search time an implicit convolution fastest (the choice is still
    checked against the generated kernel on real runs); returns the steps of the programs
    built."""
    use_kernel_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("LUMINAL_PLAN_CACHE", "0")
    clear_memory_cache()

    def measure(self, low, dims, cutoff=None):
        # (and fewer steps faster: an activation inlined into the patch copy is kept)
        calls = [s for s in low.kernels if isinstance(s, K.LibCall)]
        each = 1e-4 if any("conv_c" in c.fields for c in calls) else 1e-3
        return Timing(each * len(low.kernels))

    built: list[K.Kernel | K.LibCall] = []
    build = CpuTarget.build_plan

    def build_plan(self, low, name):
        built.extend(low.kernels)
        return build(self, low, name)

    monkeypatch.setattr(CpuTarget, "measure", measure)
    monkeypatch.setattr(CpuTarget, "build_plan", build_plan)
    return built


TORCH_GEOMETRIES = [
    # batch, channels, height, width, out channels, kernel, stride, padding, dynamic shapes
    (3, 5, 11, 9, 7, 3, 1, 1, True),
    (1, 17, 13, 10, 19, 3, 2, 1, True),
    (3, 3, 15, 12, 6, 7, 2, 3, True),
    (1, 24, 17, 17, 33, 1, 2, 0, True),
    # (dynamic, an unpadded window's index keeps divisions the copy's axes do not undo)
    (3, 10, 8, 7, 5, 3, 1, 0, False),
    (1, 4, 12, 12, 9, 7, 1, 3, True),
]


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
@pytest.mark.parametrize("geo", TORCH_GEOMETRIES, ids=lambda g: "-".join(map(str, g)))
def test_torch_conv_keeps_implicit_pgemm(geo: tuple, tmp_path, monkeypatch) -> None:
    """Through the torch backend: the staged patch copy is recognized, the implicit call kept
    and the copy dropped; the plan computes conv2d at the compiled size and another batch."""
    built = _prefer_implicit(monkeypatch, tmp_path)
    b, c, h, w, co, k, s, p, dynamic = geo
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(c, co, k, stride=s, padding=p).eval()
    f = torch.compile(conv, backend="luminal", dynamic=dynamic)
    with torch.no_grad():
        for batch in (b, b + 1) if dynamic else (b,):
            x = torch.randn(batch, c, h, w)
            torch.testing.assert_close(f(x), conv(x), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    implicit = [x for x in built if isinstance(x, K.LibCall) and "conv_c" in x.fields]
    assert implicit and all(x.func == "pgemm" for x in implicit)
    # (a 1x1 kernel's rows are read as they lie: stride 2 is a row step of two image rows)
    assert implicit[0].fields["conv_kh"] == k and implicit[0].fields["conv_sw"] == s
    assert implicit[0].fields["conv_sh"] == (s if k > 1 else 1)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
@pytest.mark.parametrize("act", ["silu", "relu"])
def test_torch_norm_act_conv(act: str, tmp_path, monkeypatch) -> None:
    """A group norm and an activation before the convolution (a diffusers ResNet block)."""
    built = _prefer_implicit(monkeypatch, tmp_path)
    torch._dynamo.reset()
    torch.manual_seed(0)
    act_mod = torch.nn.SiLU() if act == "silu" else torch.nn.ReLU()
    model = torch.nn.Sequential(torch.nn.GroupNorm(3, 12), act_mod,
                                torch.nn.Conv2d(12, 10, 3, padding=1)).eval()  # fmt: skip
    f = torch.compile(model, backend="luminal", dynamic=True)
    with torch.no_grad():
        for batch, size in ((2, 9), (3, 14)):
            x = torch.randn(batch, 12, size, size)
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    assert any(isinstance(x, K.LibCall) and "conv_c" in x.fields for x in built)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
def test_grouped_conv_keeps_its_copy(tmp_path, monkeypatch) -> None:
    """groups > 1 is not read implicitly (its batch of (image, group) matrices has no one
    stride): it stays on the patch copy and computes conv2d."""
    built = _prefer_implicit(monkeypatch, tmp_path)
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(12, 18, 3, padding=1, groups=3).eval()
    f = torch.compile(conv, backend="luminal", dynamic=False)
    with torch.no_grad():
        x = torch.randn(2, 12, 10, 11)
        torch.testing.assert_close(f(x), conv(x), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    assert not any(isinstance(x, K.LibCall) and "conv_c" in x.fields for x in built)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
def test_compile_conv_keeps_implicit_pgemm(tmp_path, monkeypatch) -> None:
    """Through luminal.compile, a symbolic batch and image size: conv2d, bias and relu."""
    built = _prefer_implicit(monkeypatch, tmp_path)
    g = lm.Graph("conv")
    b, h = lm.dim("b", 1, 8), lm.dim("h", 5, 40)
    x = g.input("x", (b, 5, h, h))
    wv, bias = rand(11, 5, 3, 3, seed=1), rand(11, seed=2)
    y = F.conv2d(x, g.weight("w", data=wv), g.weight("bias", data=bias), stride=2, padding=1)
    g.output("y", y.relu())
    cg = lm.compile(g)
    assert any(isinstance(x, K.LibCall) and "conv_c" in x.fields for x in built)
    for bs, hs in ((1, 5), (3, 17), (2, 40)):
        xv = rand(bs, 5, hs, hs, seed=hs)
        want = TF.conv2d(torch.from_numpy(xv), torch.from_numpy(wv), torch.from_numpy(bias),
                         stride=2, padding=1).relu()  # fmt: skip
        np.testing.assert_allclose(cg.run({"x": xv})["y"], want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
def test_lowered_conv_copy_becomes_implicit(tmp_path, monkeypatch) -> None:
    """A conv lowered without staging has the patch copy inside its gemm alternative
    (``copy+``): the implicit form replaces copy and call."""
    use_kernel_cache(monkeypatch, tmp_path)
    g = lm.Graph("conv")
    b = lm.dim("b", 1, 8)
    x = g.input("x", (b, 7, 12, 10))
    wv = rand(13, 7, 3, 3, seed=3)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), None, padding=1))
    labels: list[list[str]] = []

    def measure(sub, dims):
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        return 1.0 if any("conv_c" in s.fields for s in calls) else 2.0

    def variants(call, operands):
        out = CpuTarget().library_variants(call, operands)
        labels.append([label for label, _ in out])
        return out

    tuner = Tuner(measure, "test-implicit", variants=variants)
    chosen = select.choose_library_calls(lower(g), tuner)
    (call,) = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert call.func == "pgemm" and call.fields["conv_c"] == 7 and call.fields["pack"] == 0
    assert not any(isinstance(s, K.Kernel) and "copy" in s.name for s in chosen.kernels)
    ex = lm.load(build_plan(chosen, "conv").to_bytes())
    for bs in (1, 3):
        xv = rand(bs, 7, 12, 10, seed=bs)
        want = TF.conv2d(torch.from_numpy(xv), torch.from_numpy(wv), padding=1)
        np.testing.assert_allclose(ex.run({"x": xv})["y"], want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
@pytest.mark.parametrize("pad", [0, 1])
def test_values_computed_in_the_copy_move_to_the_image(pad: int, tmp_path, monkeypatch) -> None:
    """A patch copy computing x * x at each window position (as a staged copy computes a
    norm and an activation fused into it): the computation moves into a kernel over the image
    (``split_patch_copy``, once per input value instead of once per tap), which the implicit
    call reads."""
    use_kernel_cache(monkeypatch, tmp_path)
    g = lm.Graph("conv")
    b = lm.dim("b", 1, 8)
    x = g.input("x", (b, 6, 11, 9))
    wv = rand(14, 6, 3, 3, seed=3)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), None, padding=pad))
    low = lower(g)
    kern = low.kernels[0]
    assert isinstance(kern, K.Kernel)
    (read,) = [v for v in K.walk(kern.value) if isinstance(v, K.Load) and v.buf == 0]
    at = K.Load(0, read.index, 1, lm.f32)
    square = K.Masked(read.valid, K.Alu(Op.MUL, (at, at), lm.f32), lm.f32)
    low.kernels[0] = replace(kern, value=gemm._replace(kern.value, read, square))

    def measure(sub, dims):
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        return 1.0 if any("conv_c" in s.fields for s in calls) else 2.0

    tuner = Tuner(measure, f"test-implicit-image-{pad}", variants=CpuTarget().library_variants)
    chosen = select.choose_library_calls(low, tuner)
    (call,) = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert "conv_c" in call.fields
    assert [s.name for s in chosen.kernels if isinstance(s, K.Kernel)][0].endswith("_image")
    ex = lm.load(build_plan(chosen, "conv").to_bytes())
    for bs in (1, 3):
        xv = rand(bs, 6, 11, 9, seed=bs)
        want = TF.conv2d(torch.from_numpy(xv * xv), torch.from_numpy(wv), padding=pad)
        np.testing.assert_allclose(ex.run({"x": xv})["y"], want.numpy(), rtol=1e-4, atol=1e-4)


def test_implicit_conv_refuses_other_copies() -> None:
    """A copy that is no patch copy of the supported kind keeps the copy: a dilated window,
    a transposed read, a half-type image."""
    i = [sym.index_var(j, n) for j, n in enumerate((2, 3, 3, 3, 4, 4))]  # c, dy, dx, oy, ox
    fields = {"m": 5, "n": 16, "k": 27, "batch": 1}

    def copy(index, dtype=lm.f32, valid=1):
        return K.Kernel("c", (1, 3, 3, 3, 4, 4), 9, K.Load(0, index, valid, dtype), dtype)

    def at(cs, dy, oy, dx, ox):
        terms = [sym.mul(i[1], cs), sym.mul(i[2], dy), sym.mul(i[4], oy), sym.mul(i[3], dx),
                 sym.mul(i[5], ox)]  # fmt: skip
        total: sym.sint = 0
        for t in terms:
            total = sym.add(total, t)
        return total

    ok = implicit_conv(copy(at(36, 6, 6, 1, 1)), fields)
    assert ok is not None and ok[1]["conv_ih"] == 6 and ok[1]["conv_rs"] == 6
    assert implicit_conv(copy(at(36, 6, 6, 2, 1)), fields) is None  # dilated columns
    assert implicit_conv(copy(at(36, 6, 6, 1, 1), lm.bf16), fields) is None
    assert implicit_conv(copy(at(36, 6, 6, 1, 1)), {**fields, "k": 9}) is None
