"""Choose between a generated kernel and a library call by measurement.

For every kernel that ``gemm.match_gemm`` can express as a GEMM (or ``match_gemm_copy`` as a
copy of an operand into a contiguous scratch buffer and a GEMM), both programs are timed on
the target through the same runtime path that runs plans (the tuner's ``measure``, given by
the caller, so this module names no backend). Sizes use each dim at a representative value.
The tuner (tuner.py) ranks, measures, checks the kept program against the generated kernel
on random inputs, and caches the decision on disk by (kernel, alternative, sizes, target), so
a second compile is fast and the choice is deterministic once cached. ``LUMINAL_DEBUG>=3``
prints every decision.

With q8 activations (``compiler/actquant.py``) a product by a block-quantized weight also has
a ``qdot`` call (``gemm.match_qdot``: integer dot products); every option of that choice is
timed and checked with the kernel that writes the activation cut out beside it, so the call
sees the q8 values the plan computes, not random floats.

A product whose B operand is a convolution's patches (an operand copy of the alternative, or a
kernel of the program that writes them for it alone: a staged copy) also has an implicit
convolution (conv.py): the call reads B straight from the image, the copy is gone; a staged
copy that computes its values (a norm and an activation fused in) becomes a kernel computing
them over the image, which the call reads. A staged copy is cut out with every other option
and timed with them; kept, the implicit call drops it from the program.

A choice is timed at both ends of its range. When one program wins at the smallest size and
another at the representative one, and the kept one is ``SPLIT_LOSS`` times slower than the
best at either end (a GEMV that dequantizes its weights per row, against a dequantized copy
and a GEMM: one token and 256), the range of the product of the kernel's free dims (its rows)
is split where the two programs' times, linear in it between the two measured sizes, cross;
each part keeps its end's winner, and its steps carry ``when`` (they run only for their part:
plan format 3 conditions).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ... import flags
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from .. import kernel_ir as K
from ..actquant import mode as act_quant_mode
from ..lower import BufferInfo, Lowered, Role
from ..schedule import alternatives
from .conv import implicit_conv, split_patch_copy
from .cost import estimate
from .gemm import GemmAlternative, match_any, match_qdot
from .tuner import (
    TYPICAL_DIMS,
    Candidate,
    Timing,
    Tuner,
    fit_product,
    smallest_dims,
    sub_fingerprint,
)

# smallest product (m*n*k) worth timing a library call for; below it the call overhead wins
MIN_GEMM_WORK = 1 << 15
REPRESENTATIVE_DIM = 256
# the minimax choice's loss (its time over the best at its worse end) above which the range
# is split: below it one program serves the whole range without a second kernel. Set by
# SmolLM2's 576 x 576 projection, whose dequantized copy + GEMM lost 1.17x at one token in the
# search and about 1.4x in decode (0.55 ms against 0.39)
SPLIT_LOSS = 1.1
# an option the cost model estimates this many times the cheapest, at the representative and
# at the smallest sizes, is not measured. Set by SmolLM2's decode and prefill plans (2 threads
# of the development machine): over their 16 generated-or-library choices every option
# estimated 2.2x the cheapest or more measured 1.9-120x slower than the fastest (dequantized
# copies + GEMMs of Q4_1 weights, generated f32 GEMMs), and every winner was estimated within
# 1.4x of the cheapest
DECISIVE = 2.0
# a call that runs its epilogue itself (Target.library_epilogues) is estimated as the call and
# the epilogue kernel apart (the cost model prices no work inside a call) times this: ranked
# just ahead of them, and measured against them
FUSED_RANK = 0.99

Step = K.Kernel | K.LibCall
# measure(lowered_subprogram, dims) -> median seconds (or a Timing with the outputs)
Measure = Callable[[Lowered, dict[str, int]], "float | Timing"]


def representative_dims(low: Lowered) -> dict[str, int]:
    """The size every symbolic dim takes while candidates are measured: its typical value
    (``TYPICAL_DIMS``) where the caller gave one. Otherwise dims multiply (batch x seq rows),
    so they share one budget of ``REPRESENTATIVE_DIM``: one dim gets 256, two get 16 each.
    256 of each would time a (65536 x k) product for a batch of sentences, seconds per
    candidate, at a size the model rarely sees."""
    typical = TYPICAL_DIMS.get() or {}
    free = [n for n, d in low.dims.items() if d.hi > d.lo and n not in typical]
    each = max(1, int(round(REPRESENTATIVE_DIM ** (1 / max(len(free), 1)))))
    out = {n: min(max(typical.get(n, each), d.lo), d.hi) for n, d in low.dims.items()}
    return fit_product(out, K.part_of(low.kernels), low.dims)


def restricted(dims: dict[str, sym.Expr], when: K.When | None) -> dict[str, sym.Expr]:
    """``dims`` with the dims of ``when`` narrowed to its range: exactly for one dim; for a
    product, each dim to the values some point of the part has (the part itself is kept with
    the steps, which ``representative_dims`` and ``smallest_dims`` measure within)."""
    if when is None:
        return dict(dims)
    names, lo, hi = when
    out = dict(dims)
    for n in names:
        others_lo = others_hi = 1
        for m in names:
            if m != n:
                others_lo *= max(dims[m].lo, 1)
                others_hi *= dims[m].hi
        d = dims[n]
        out[n] = sym.dim(n, max(d.lo, -(-lo // others_hi)), min(d.hi, hi // others_lo))
    return out


def subprogram(low: Lowered, steps: Sequence[Step], extra: Sequence[BufferInfo] = ()) -> Lowered:
    """Just ``steps`` with the buffers they touch: what they read before writing becomes an
    input, what they write an output. Buffers are renumbered in order of use (so identical
    layers give identical programs) and named after their id in ``low`` (so two cut-outs that
    read the same buffers in another order get the same random inputs). Steps that run for a
    part of a dim's range only (``when``) are cut out with that part as the dim's range."""
    buffers = list(low.buffers) + list(extra)
    used: list[int] = []
    written: set[int] = set()
    read: set[int] = set()
    for s in steps:
        w, r = K.step_buffers(s)
        for b in r + w:
            if b not in used:
                used.append(b)
        written |= set(w)
        read |= set(r) - written
    ids = {b: i for i, b in enumerate(used)}
    new_bufs = []
    for b in used:
        info = buffers[b]
        role: Role = "input" if b in read and b not in written else "output"
        new_bufs.append(BufferInfo(ids[b], f"b{b}", info.dtype, info.shape, role))
    new_steps: list[Step] = []
    for s in steps:
        if isinstance(s, K.LibCall):
            new_steps.append(replace(s, args=[ids[a] for a in s.args], out=ids[s.out]))
        else:
            row = K.remap_buffers(s.scatter_row, ids) if s.scatter_row is not None else None
            new_steps.append(replace(s, value=cut_value(s.value, ids), out=ids[s.out],
                                     scatter_row=row))  # fmt: skip
    dims = restricted(low.dims, K.part_of(steps))
    return Lowered(new_bufs, new_steps, dims, {})  # type: ignore[arg-type]


# cut_value results kept: the search cuts out every schedule candidate of a kernel (they
# share its value tree) and renders each the same way
CUT_KEPT = 2048
_CUT: OrderedDict[tuple, tuple[K.Value, K.Value]] = OrderedDict()


def cut_value(v: K.Value, ids: dict[int, int]) -> K.Value:
    """``v`` as a cut-out program holds it: buffers renumbered by ``ids``, variables renamed
    by ``canonical_vars``. Kept per tree object (held with its entry, so the id is not
    reused while the entry lives) and buffer map."""
    key = (id(v), tuple(sorted(ids.items())))
    hit = _CUT.get(key)
    if hit is not None and hit[0] is v:
        _CUT.move_to_end(key)
        return hit[1]
    out = canonical_vars(K.remap_buffers(v, ids), [0])
    _CUT[key] = (v, out)
    if len(_CUT) > CUT_KEPT:
        _CUT.popitem(last=False)
    return out


def canonical_vars(
    v: K.Value, count: list[int], memo: dict[K.Value, K.Value] | None = None, tag: str = "c"
) -> K.Value:
    """``v`` with its reduction, gather and softmax variables renamed ``_rc0``, ``_rc1``, ... in
    tree order: lowering names them after graph nodes, which differ between identical layers.
    (The ``tag`` ``c`` keeps new names apart from the old ones still in the tree; a tree named
    so already is renamed with another tag.) Equal subtrees (shared, or rebuilt alike by
    substitutions) get one result, so code generation still computes them once."""
    memo = {} if memo is None else memo
    hit = memo.get(v)
    if hit is not None:
        return hit
    out: K.Value = v
    rec = lambda x: canonical_vars(x, count, memo, tag)  # noqa: E731
    if isinstance(v, (K.Reduce, K.Gather, K.SoftmaxSum)):
        _, lo, hi, extent = v.var.args
        new = sym.var(f"{'_g' if isinstance(v, K.Gather) else '_r'}{tag}{count[0]}", lo, hi, extent)
        count[0] += 1
        ren: dict[str, sym.sint] = {v.var.name: new}
        if isinstance(v, K.Reduce):
            out = K.Reduce(v.op, new, v.extent, rec(K.substitute(v.body, ren)), v.dtype)
        elif isinstance(v, K.Gather):
            out = K.Gather(new, rec(v.row), v.rows, rec(K.substitute(v.body, ren)), v.dtype)
        else:
            score, weight = rec(K.substitute(v.score, ren)), rec(K.substitute(v.weight, ren))
            out = K.SoftmaxSum(new, v.extent, score, weight, v.dtype)
    elif isinstance(v, K.Alu):
        out = K.Alu(v.op, tuple(rec(x) for x in v.srcs), v.dtype)
    elif isinstance(v, K.Cast):
        out = K.Cast(rec(v.src), v.dtype)
    elif isinstance(v, K.Masked):
        out = K.Masked(v.valid, rec(v.value), v.dtype)
    memo[v] = out
    return out


_sub_fp = sub_fingerprint  # device backends key their own decisions with it


def choose_library_calls(low: Lowered, measure: Measure | Tuner, target: str = "") -> Lowered:
    """Replace kernels by library calls where measurement says the call is faster.
    ``measure`` is a Tuner, or a measuring function for a Tuner on ``target``.

    Every kernel's candidates are listed first (their new buffers numbered as if every call
    were kept), each decision handed to the tuner to compile in the background as it is
    listed, the rest compiled in one batch before the measurements; a kept call's buffers are
    then renumbered to follow the buffers the program has."""
    tuner = measure if isinstance(measure, Tuner) else Tuner(measure, target)
    dims = representative_dims(low)
    provisional = list(low.buffers)
    plans: list[_Choice | None] = []
    decisions: dict[str, _Decision | None] = {}
    for kern in low.kernels:
        choice = _options(low, kern, provisional, tuner, dims)
        plans.append(choice)
        if choice is not None:
            provisional += choice.extra
            if choice.key not in decisions:
                cands = _candidates(low, provisional, choice, tuner, dims)
                d = decisions[choice.key] = _decision(low, choice, cands, tuner, dims)
                if d is not None:  # compiled while the next kernels' options are listed
                    tuner.prefetch([("gemm", dims, d.reference, d.cands)], wait=False)
    tuner.prefetch([("gemm", dims, d.reference, d.cands) for d in decisions.values() if d])
    steps: list[Step] = []
    buffers = list(low.buffers)
    memo: dict[str, list[tuple[str, K.When | None]]] = {}
    dropped: set[int] = set()  # staged copies that kept implicit convolutions left unneeded
    for kern, choice in zip(low.kernels, plans, strict=True):
        if choice is None:
            steps.append(kern)
            continue
        if choice.key not in memo:
            d = decisions[choice.key]
            memo[choice.key] = (
                [("generated", None)] if d is None else _decide(d, tuner, kern.name, choice.bare)
            )
        payloads = dict(choice.options)
        picks = [(payloads[label], when) for label, when in memo[choice.key]]
        if choice.drop is not None and all(label in choice.bare for label, _ in memo[choice.key]):
            dropped.add(id(choice.drop))
        added = False
        ids = {b.id: len(buffers) + i for i, b in enumerate(choice.extra)}
        for payload, when in picks:
            if isinstance(payload, K.Kernel):
                # a part after the first keeps a generated kernel under a name of its own:
                # its code may differ from the first part's (another task order)
                name = payload.name if when is None or when is picks[0][1] else (
                    f"{payload.name}_{K.when_label(when)}"
                )  # fmt: skip
                steps.append(replace(payload, when=when, name=name))
                continue
            if not added:
                buffers += [replace(b, id=ids[b.id]) for b in choice.extra]
                added = True
            steps += [replace(_renumbered(s, ids), when=when) for s in payload]
    steps = [s for s in steps if id(s) not in dropped]
    return Lowered(buffers, steps, low.dims, low.weights, low.windowed)  # type: ignore[arg-type]


@dataclass
class _Choice:
    """One kernel's library-call choice: its options (label -> the kernel or the steps that
    replace it), the buffers those steps add, and the key identical layers share."""

    options: list[tuple[str, K.Kernel | list[Step]]]
    extra: list[BufferInfo]
    sub_gen: Lowered
    key: str
    # steps cut out with every option (not replaced): the kernel writing a qdot call's
    # activation, so each option is timed and checked on the activation the plan computes
    context: list[Step]
    # label -> the steps a fused option is estimated as (FUSED_RANK), and their cut-out
    proxies: dict[str, list[Step]] = field(default_factory=dict)
    proxy_subs: dict[str, Lowered] = field(default_factory=dict)
    # options cut out without ``context``: implicit convolutions, which read the image the
    # context's staged copy (``drop``) reads; kept, they leave the copy unneeded
    bare: set[str] = field(default_factory=set)
    drop: K.Kernel | None = None


def _options(
    low: Lowered, kern: Step, buffers: list[BufferInfo], tuner: Tuner, dims: dict[str, int]
) -> _Choice | None:
    """The choice to take for ``kern`` (its new buffers numbered from ``len(buffers)``);
    None when it has no library form worth timing."""
    if not isinstance(kern, K.Kernel):
        return None
    alt = match_any(kern, len(buffers))
    extra = _extra(kern, alt) if alt is not None else []
    qalt = match_qdot(kern, len(buffers) + len(extra)) if act_quant_mode() == "q8" else None
    context = _producers(low, kern, qalt) if qalt is not None else []
    if qalt is not None and not context:
        qalt = None  # an activation not computed here (a plan input) is not known to be q8
    conv = None
    if alt is not None and qalt is None:
        conv = _implicit(low, kern, alt, len(buffers) + len(extra))
        if conv is not None and conv[2] is not None:
            image = conv[2]
            extra.append(BufferInfo(image.out, image.name, dt.f32, image.shape, "scratch"))
    options: list[tuple[str, K.Kernel | list[Step]]] = [("generated", kern)]
    proxies: dict[str, list[Step]] = {}
    bare: set[str] = set()
    for a in (alt, qalt):
        if a is None:
            continue
        work = int(sym.evaluate(sym.mul(sym.mul(sym.mul(a.m, a.n), a.k), a.batch), dims))
        if work < MIN_GEMM_WORK:
            if flags.debug() >= 3:
                print(f"luminal search: {kern.name}: {a.call.func} work {work} < "
                      f"{MIN_GEMM_WORK}, not timed", file=sys.stderr)  # fmt: skip
            continue
        if a is qalt:
            extra += _extra(kern, a)
        prefix = "copy+" if a.copies else ""
        suffix = "+epilogue" if a.epilogue else ""
        known = {b.id: b for b in [*buffers, *extra]}
        operands = [known[x] for x in a.call.args]
        variants = tuner.variants(a.call, operands) if tuner.variants is not None else []
        forms = [(a.call.func, a.call), *variants]
        if a is alt and conv is not None:
            # the search measures the cheapest few: the implicit form (estimated just under
            # the copy and call it replaces), then the target's own forms, which 8 of the 9
            # staged convolutions of a diffusers VAE kept over the plain gemm call
            forms = [*variants, forms[0]]
        for label, call in forms:
            lib_steps: list[Step] = [*a.copies, call, *([a.epilogue] if a.epilogue else [])]
            options.append((prefix + label + suffix, lib_steps))
        if a.epilogue is not None and tuner.epilogues is not None:
            # calls that compute the epilogue themselves, timed against call + epilogue
            for label, call in tuner.epilogues(a.call, a.epilogue, operands):
                options.append((prefix + label, [*a.copies, call]))
                proxies[prefix + label] = [*a.copies, a.call, a.epilogue]
        if a is alt and conv is not None:
            bare |= _implicit_options(conv, a, known, tuner, options, proxies)
    if len(options) == 1:
        return None
    if qalt is None or not any(label.endswith("qdot") or "qdot+" in label
                               for label, _ in options):  # fmt: skip
        context = []
    drop = conv[1] if conv is not None and bare else None
    if drop is not None:
        context = [drop]
    # the generated kernel in the other task order too: few rows by a large weight (a
    # short sequence's projections) read the weight once instead of once per row
    if any(s.order == 1 for s in alternatives(kern, tuner.space)):
        options.append(("generated,order=1", replace(kern, schedule=K.Schedule(order=1))))
    # cut out, buffers renumbered, so identical layers share one decision (and take it
    # without cutting out and estimating their candidates again)
    sub_gen = subprogram(low, [*context, kern])
    key = f"{sub_fingerprint(sub_gen)}|{[o[0] for o in options]}"
    return _Choice(options, extra, sub_gen, key, context, proxies, bare=bare, drop=drop)


def _implicit(
    low: Lowered, kern: K.Kernel, alt: GemmAlternative, new_buffer_id: int
) -> tuple[K.LibCall, K.Kernel | None, K.Kernel | None] | None:
    """``alt``'s call reading its B operand straight from an image (``conv.implicit_conv``)
    where B is a patch copy: the alternative's own copy, or a kernel of the program that
    writes B for ``kern`` alone (returned second: kept, the call makes it unneeded). Third,
    a kernel writing the image the call reads (buffer ``new_buffer_id``), where the copy
    computes its values (``conv.split_patch_copy``); else None."""
    b = alt.call.args[1]
    producer: K.Kernel | None = None
    span: Sequence[Step] = ()
    if alt.copies:
        if len(alt.copies) != 1 or alt.copies[0].out != b:
            return None
        copy = alt.copies[0]
    else:
        if b >= len(low.buffers) or low.buffers[b].role != "scratch" or kern.when is not None:
            return None
        at = next(i for i, s in enumerate(low.kernels) if s is kern)
        p_at = next((i for i in range(at - 1, -1, -1) if b in K.step_buffers(low.kernels[i])[0]),
                    None)  # fmt: skip
        if p_at is None:
            return None
        span = low.kernels[p_at + 1 : at]
        found = low.kernels[p_at]
        if not isinstance(found, K.Kernel) or found.out != b or found.scatter_row is not None \
                or found.when is not None:  # fmt: skip
            return None
        if any(b in K.step_buffers(s)[1] for s in low.kernels if s is not kern):
            return None
        producer = copy = found
    hit = implicit_conv(copy, alt.call.fields)
    computed = None
    if hit is None:
        split = split_patch_copy(copy, alt.call.fields, new_buffer_id)
        if split is not None:
            computed = split[0]
            hit = implicit_conv(split[1], alt.call.fields)
    if hit is None:
        return None
    image, fields = hit
    if producer is not None and any(image in K.step_buffers(s)[0] for s in span):
        return None  # the image changes between the copy and the product
    args = [alt.call.args[0], image, *alt.call.args[2:]]
    return replace(alt.call, fields=fields, args=args), producer, computed


def _implicit_options(
    conv: tuple[K.LibCall, K.Kernel | None, K.Kernel | None], alt: GemmAlternative,
    known: dict[int, BufferInfo],
    tuner: Tuner, options: list[tuple[str, K.Kernel | list[Step]]],
    proxies: dict[str, list[Step]],
) -> set[str]:  # fmt: skip
    """Adds the target's forms of the implicit convolution ``conv`` (its call, the staged copy
    it replaces if any, the kernel computing the image it reads if any), alone, with ``alt``'s
    epilogue kernel, or computing it, to ``options``; their labels. Each is estimated as the
    copy and the call it replaces (``FUSED_RANK``): the cost model prices no work inside a
    call, so the call alone, priced as a fraction of the copy and the call, would leave the
    copies' options unmeasured."""
    call, producer, computed = conv
    operands = [known[x] for x in call.args]
    epi: list[Step] = [alt.epilogue] if alt.epilogue else []
    first: list[Step] = [computed] if computed is not None else []
    suffix = "+epilogue" if alt.epilogue else ""
    copied: list[Step] = [*alt.copies, *([producer] if producer is not None else [])]
    labels = set()
    forms = tuner.variants(call, operands) if tuner.variants is not None else []
    for label, variant in forms:
        options.append((f"implicit+{label}{suffix}", [*first, variant, *epi]))
        labels.add(f"implicit+{label}{suffix}")
    if alt.epilogue is not None and tuner.epilogues is not None:
        for label, variant in tuner.epilogues(call, alt.epilogue, operands):
            options.append((f"implicit+{label}", [*first, variant]))
            labels.add(f"implicit+{label}")
    for label in labels:
        proxies[label] = [*copied, alt.call, *epi]
    return labels


def _extra(kern: K.Kernel, alt: GemmAlternative) -> list[BufferInfo]:
    """The buffers an alternative adds, in id order: the operand copies, then the product."""
    extra = [BufferInfo(c.out, c.name, c.dtype, c.shape, "scratch") for c in alt.copies]
    if alt.scratch_shape is not None:
        extra.append(
            BufferInfo(alt.call.out, f"{kern.name}_prod", dt.f32, alt.scratch_shape, "scratch")
        )
    return extra


def _producers(low: Lowered, kern: K.Kernel, alt: GemmAlternative) -> list[Step]:
    """The kernel that last writes ``alt``'s activation (its first argument) before ``kern``,
    as a one-step list; empty when a plan input or no single kernel provides it."""
    a = alt.call.args[0]
    if low.buffers[a].role != "scratch":
        return []
    at = next(i for i, s in enumerate(low.kernels) if s is kern)
    for s in reversed(low.kernels[:at]):
        if isinstance(s, K.Kernel) and s.out == a and s.scatter_row is None and s.when is None:
            return [s]
        if a in K.step_buffers(s)[0]:
            return []
    return []


def _renumbered(step: Step, ids: dict[int, int]) -> Step:
    """``step`` with the buffer ids of ``ids`` replaced (the others kept)."""
    if not ids or all(a == b for a, b in ids.items()):
        return step
    if isinstance(step, K.LibCall):
        return replace(
            step, args=[ids.get(a, a) for a in step.args], out=ids.get(step.out, step.out)
        )
    w, r = K.step_buffers(step)
    full = {b: ids.get(b, b) for b in [*w, *r]}
    row = K.remap_buffers(step.scatter_row, full) if step.scatter_row is not None else None
    return replace(step, value=K.remap_buffers(step.value, full), out=full[step.out],
                   scatter_row=row)  # fmt: skip


@dataclass
class _Decision:
    """One library-call choice to measure: the candidates within ``DECISIVE`` of the cheapest
    estimate, and the program the kept one is checked against."""

    cands: list[Candidate]
    reference: Lowered
    dims: dict[str, int]


def _candidates(
    low: Lowered, buffers: list[BufferInfo], choice: _Choice, tuner: Tuner, dims: dict[str, int]
) -> list[Candidate]:
    """The cut-out program of every option (``buffers`` holds every new buffer so far)."""
    sub_gen = choice.sub_gen
    cands = [Candidate("generated", sub_gen, estimate(sub_gen, dims, tuner.cost),
                       choice.options[0][1], ("generated", "generated"))]  # fmt: skip
    for label, payload in choice.options[1:]:
        ctx = [] if label in choice.bare else choice.context
        if isinstance(payload, K.Kernel):
            sub = subprogram(low, [*ctx, payload])
        else:
            sub = subprogram(low, [*ctx, *payload], buffers[len(low.buffers) :])
        cost = estimate(sub, dims, tuner.cost)
        if label in choice.proxies:
            proxy = subprogram(low, [*ctx, *choice.proxies[label]], buffers[len(low.buffers) :])
            choice.proxy_subs[label] = proxy
            cost = FUSED_RANK * estimate(proxy, dims, tuner.cost)
        cands.append(Candidate(label, sub, cost, payload, (_implementation(payload), label)))
    return cands


def _implementation(payload: K.Kernel | list[Step]) -> str:
    """What runs an option's product: "generated", or its library call's function. The
    measured slots go to different ones among options the cost model ties (``spread``): it
    prices every call's flops alike, so the forms of one call (an implicit convolution and the
    copy it replaces, a GEMM's register blockings) had taken the slots of another call that
    measured faster (the plain gemm call on a 56x56 convolution's patches, 1.65 against 2.5 ms)."""
    if isinstance(payload, K.Kernel):
        return "generated"
    return next((s.func for s in payload if isinstance(s, K.LibCall)), "generated")


def _decision(
    low: Lowered, choice: _Choice, cands: list[Candidate], tuner: Tuner, dims: dict[str, int]
) -> _Decision | None:
    """The options of ``cands`` the cost model leaves in the running; None when the generated
    kernel is kept unmeasured: every other option is estimated ``DECISIVE`` times slower at
    both ends of the range, or only generated kernels are left and the schedule stage chooses
    their task order anyway."""
    small = smallest_dims(cands[0].sub, dims)
    near = {i for i, c in enumerate(cands) if c.cost <= DECISIVE * min(x.cost for x in cands)}
    if small != dims:
        at_small = [
            FUSED_RANK * estimate(choice.proxy_subs[c.label], small, tuner.cost)
            if c.label in choice.proxy_subs else estimate(c.sub, small, tuner.cost)
            for c in cands
        ]  # fmt: skip
        near |= {i for i, t in enumerate(at_small) if t <= DECISIVE * min(at_small)}
    kept = [c for i, c in enumerate(cands) if i in near]
    if all(isinstance(c.payload, K.Kernel) for c in kept) and (len(kept) == 1 or tuner.schedules):
        return None
    if kept[0] is cands[0]:
        return _Decision(kept, cands[0].sub, dims)
    # the generated kernel is not measured: the kept call is checked against the kernel as
    # lowered, plain loops that compile in a fraction of the scheduled kernel's time
    gen = choice.options[0][1]
    assert isinstance(gen, K.Kernel)
    plain = replace(gen, schedule=K.Schedule(split=0, jam=0))
    return _Decision(kept, subprogram(low, [*choice.context, plain]), dims)


def _decide(
    d: _Decision, tuner: Tuner, name: str, bare: set[str]
) -> list[tuple[str, K.When | None]]:
    """The labels of the candidates to keep, each with the part of the range it runs for.
    A split range keeps the winner at each end for its part, from the measurements the
    decision took (re-measuring within each part compiled every generated candidate again, for
    the same answer); a part's winner other than the decision's is checked against the
    reference first, and the range is not split when it does not match."""
    chosen, record = tuner.decide(name, "gemm", d.dims, d.reference, d.cands)
    parts = _split(d.reference, d.dims, record)
    if parts is not None and len({label in bare for _, label in parts}) > 1:
        # an implicit convolution in one part only: the staged copy stays for the other, and
        # the layouts stage would cut out the copy's readers without the call
        parts = None
    if parts is None:
        return [(chosen.label, None)]
    by_label = {c.label: c for c in d.cands}
    for rng, label in parts:
        cand = by_label[label]
        if cand is chosen or cand.sub is d.reference:
            continue
        part = f"{name}[{'*'.join(rng[0])} {rng[1]}..{rng[2]}]"
        _, rec = tuner.decide(part, "gemm", d.dims, d.reference, [cand])
        if rec is None or rec["candidates"][0]["verdict"] is False:
            return [(chosen.label, None)]
    return [(label, rng) for rng, label in parts]


def _split(
    sub: Lowered, dims: dict[str, int], record: dict | None
) -> list[tuple[K.When, str]] | None:
    """The two parts of the range of the kernel cut out as ``sub`` to decide apart (see the
    module doc), each with the label of the candidate that won at its end, or None. The range
    is of the product of its free dims (its rows: batch x seq); each candidate's time is
    taken as linear in the product through its two measurements, and the parts meet where the
    small-end winner's line crosses the representative winner's."""
    shapes = [k.shape for k in sub.kernels if isinstance(k, K.Kernel)] + [
        b.shape for b in sub.buffers
    ]
    used = {v.name for shape in shapes for v in sym.free_dims(shape)}
    free = tuple(sorted(n for n, d in sub.dims.items() if d.hi > d.lo and n in used))
    rows = {v.name for k in sub.kernels if isinstance(k, K.Kernel) for v in sym.free_dims(k.shape)}
    if record is None or not free or (len(free) > 1 and not set(free) <= rows):
        # several dims, one of them not a row dim (a KV length): time is not linear in
        # their product
        return None
    n0 = n1 = lo = hi = 1
    small = smallest_dims(sub, dims)
    for n in free:
        n0, n1 = n0 * small[n], n1 * dims[n]
        lo, hi = lo * sub.dims[n].lo, hi * sub.dims[n].hi
    timed = [c for c in record["candidates"] if c["seconds"] and c.get("small_seconds")]
    if n1 <= n0 + 1 or len(timed) < 2:
        return None
    at_rep = min(timed, key=lambda c: c["seconds"])
    at_small = min(timed, key=lambda c: c["small_seconds"])
    if at_rep is at_small:
        return None
    kept = record["candidates"][record["choice"]]
    if kept["seconds"] is None or kept.get("small_seconds") is None:
        return None
    loss = max(kept["seconds"] / at_rep["seconds"],
               kept["small_seconds"] / at_small["small_seconds"])  # fmt: skip
    if loss < SPLIT_LOSS:
        return None

    def line(c: dict) -> tuple[float, float]:  # time = a + b * n
        b = (c["seconds"] - c["small_seconds"]) / (n1 - n0)
        return c["small_seconds"] - b * n0, b

    (a_s, b_s), (a_r, b_r) = line(at_small), line(at_rep)
    cross = (a_r - a_s) / (b_s - b_r) if b_s > b_r else (n0 * n1) ** 0.5
    t = min(max(int(cross) + 1, n0 + 1), n1)
    return [((free, lo, t - 1), at_small["label"]), ((free, t, hi), at_rep["label"])]
