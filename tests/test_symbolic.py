import random

import luminal.graph.symbolic as sym


def _depth(e: sym.sint) -> int:
    return 1 + max(map(_depth, e.args)) if isinstance(e, sym.Expr) and e.kind in (
        sym.MIN, sym.MAX
    ) else 0  # fmt: skip


def test_extremum_absorbs_repeats_and_dominated_operands():
    seq, pos = sym.dim("seq", 1, 4096), sym.dim("pos", 0, 4096)
    a, b = sym.mul(seq, 6144), sym.mul(sym.add(seq, pos), 64)
    m = sym.maximum(a, b)
    for _ in range(30):  # a memory slot growing buffer by buffer
        m = sym.maximum(m, a)
        m = sym.maximum(b, m)
    assert m is sym.maximum(a, b) and _depth(m) == 1
    # seq * 12 <= seq * 6144 is provable, so it adds nothing
    assert sym.maximum(m, sym.mul(seq, 12)) is m
    assert sym.minimum(sym.minimum(a, 7), sym.minimum(b, 5)) == 5
    assert sym.maximum(sym.maximum(a, 7), 9) is a
    assert sym.minimum(sym.mul(seq, 2), seq) is seq


def test_extremum_values_match_python():
    rng = random.Random(0)
    x, y = sym.dim("x", 1, 50), sym.dim("y", 0, 50)
    leaves = [x, y, sym.mul(x, 3), sym.add(y, 4), sym.add(x, y), 7, 0, 30]
    for _ in range(300):
        exprs = [rng.choice(leaves) for _ in range(rng.randint(2, 6))]
        kinds = [rng.choice((sym.minimum, sym.maximum)) for _ in exprs]
        e = exprs[0]
        for k, o in zip(kinds[1:], exprs[1:], strict=True):
            e = k(e, o) if rng.random() < 0.5 else k(o, e)
        for _ in range(5):
            env = {"x": rng.randint(1, 50), "y": rng.randint(0, 50)}
            want = sym.evaluate(exprs[0], env)
            for k, o in zip(kinds[1:], exprs[1:], strict=True):
                v = sym.evaluate(o, env)
                want = min(want, v) if k is sym.minimum else max(want, v)
            assert sym.evaluate(e, env) == want, (e, env)


def _check_divmod(nums: list, b: sym.sint, heads: int, ks: tuple[int, ...]) -> None:
    """floordiv and mod of each numerator by ``b`` against Python's ints, over p < 10, every
    head h and key position j <= p, and the k of ``ks``."""
    for num in nums:
        q, r = sym.floordiv(num, b), sym.mod(num, b)
        for pv in range(10):
            for hv in range(heads):
                for jv in range(pv + 1):
                    for kv in ks:
                        env = {"p": pv, "h": hv, "j": jv, "k": kv}
                        x, y = sym.evaluate(num, env), sym.evaluate(b, env)
                        assert sym.evaluate(q, env) == x // y, (num, env)
                        assert sym.evaluate(r, env) == x % y, (num, env)


def test_divisors_with_a_constant_term_split_and_stay_exact():
    """(32*h*p + 32*h + 32*j + k) // (32*p + 32) is h when j <= p and k < 32: a KV cache of
    past + 1 positions read head by head. Every split checked against Python's ints, including
    numerators the divisor does not divide evenly and negative constants."""
    p = sym.dim("p", 0, 9)
    h = sym.var("h", 0, 3, 4)
    j = sym.var("j", 0, 9, sym.add(p, 1))
    k = sym.var("k", 0, 31, 32)
    b = sym.add(sym.mul(32, p), 32)
    a = sym.add(sym.add(sym.add(sym.mul(32, h), sym.mul(32, j)), k), sym.mul(32, sym.mul(h, p)))
    assert sym.floordiv(a, b) is h
    assert sym.mod(a, b) == sym.add(sym.mul(32, j), k)
    others = [
        sym.add(sym.mul(32, p), 5),
        sym.add(sym.mul(32, p), 40),
        sym.add(sym.mul(64, p), 70),
        sym.add(sym.mul(32, sym.mul(h, p)), sym.mul(33, h)),
        sym.add(sym.add(sym.mul(32, sym.mul(h, p)), sym.mul(32, h)), -3),
    ]
    _check_divmod([a, *others], b, heads=4, ks=(0, 7, 31))


def test_polynomial_divisors_with_a_common_factor_split_through_it():
    """(32*(p + 1)*h + 32*j + k) // (64*(p + 1)) is h // 2 (grouped-query attention over a KV
    cache of p + 1 positions); checked against Python's ints with its modulo."""
    p = sym.dim("p", 0, 9)
    h = sym.var("h", 0, 7, 8)
    j = sym.var("j", 0, 9, sym.add(p, 1))
    k = sym.var("k", 0, 31, 32)
    b = sym.add(sym.mul(64, p), 64)
    a = sym.add(sym.add(sym.add(sym.mul(32, h), sym.mul(32, j)), k), sym.mul(32, sym.mul(h, p)))
    assert sym.floordiv(a, b) is sym.floordiv(h, 2)
    odd = sym.add(a, sym.mul(5, j))  # 37*j + k reaches past 32*(p + 1): no split
    _check_divmod([a, odd], b, heads=8, ks=(0, 31))


def test_a_remainder_within_one_multiple_divides_to_a_constant():
    """The split keeps a constant's remainder in the part it cannot move:
    (32*h + k - 16) // 128 is (32*h + k + 112) // 128 - 1, and where 16 <= k (the second half
    of a concatenation) the division is 0 and the modulo the number itself."""
    h = sym.var("h", 0, 3, 4)
    k = sym.var("k", 16, 31, 32)
    a = sym.add(sym.add(sym.mul(32, h), k), -16)
    assert sym.floordiv(a, 128) == 0
    assert sym.mod(a, 128) == a
    kk = sym.var("k", 0, 31, 32)  # the whole range: the answer depends on k
    b = sym.add(sym.add(sym.mul(32, h), kk), -16)
    assert sym.has_divmod(sym.floordiv(b, 128)) and sym.has_divmod(sym.mod(b, 128))
    for c in (-300, -16, 5, 112, 128, 250):
        e = sym.add(sym.add(sym.mul(32, h), k), c)
        for hv in range(4):
            for kv in (16, 20, 31):
                x = 32 * hv + kv + c
                env = {"h": hv, "k": kv}
                assert sym.evaluate(sym.floordiv(e, 128), env) == x // 128, (c, hv, kv)
                assert sym.evaluate(sym.mod(e, 128), env) == x % 128, (c, hv, kv)


def test_dim_padded_to_a_multiple_is_whole_blocks():
    # a window partition pads n up to n + (-n % c): a reshape into (blocks, c) must see that
    # it is c times a whole number of blocks, for a plain dim and a derived one
    s = sym.dim("s", 1, 1000)
    for n, c in ((s, 7), (sym.floordiv(s, 4), 4), (sym.add(sym.mul(s, 3), 2), 5)):
        p = sym.add(n, sym.mod(sym.mul(n, -1), c))
        blocks = sym.floordiv(p, c)
        assert sym.add(sym.mul(blocks, c), sym.mul(p, -1)) == 0, p
        assert sym.mod(p, c) == 0
        for v in range(1, 60):
            nv = sym.as_int(sym.substitute(n, {"s": v}))
            assert sym.as_int(sym.substitute(p, {"s": v})) == nv + (-nv % c)


def test_padded_dim_reshapes_into_blocks():
    import numpy as np

    import luminal as lm

    seq = lm.dim("seq", 1, 64)
    g = lm.Graph("pad")
    x = g.input("x", (2, seq))
    pad = sym.mod(sym.mul(seq, -1), 4)
    g.output("y", x.pad_dim(1, 0, pad).reshape(2, -1, 4).sum(2))
    cg = lm.compile(g)
    for n in (1, 5, 8, 11):
        a = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        ref = np.pad(a, ((0, 0), (0, -n % 4))).reshape(2, -1, 4).sum(2)
        np.testing.assert_allclose(cg.run({"x": a})["y"], ref, rtol=1e-5, atol=1e-5)


def test_pad_amount_written_through_a_remainder_folds_too():
    # PyTorch writes a pad up to a multiple as (c - n % c) % c: (-(n % c)) % c is (-n) % c
    s = sym.dim("s", 1, 1000)
    n = sym.mul(s, 2)
    p = sym.add(n, sym.mod(sym.mul(sym.mod(n, 3), -1), 3))
    assert sym.mod(p, 3) == 0
    assert sym.add(sym.mul(sym.floordiv(p, 3), 3), sym.mul(p, -1)) == 0
    for v in range(1, 40):
        assert sym.as_int(sym.substitute(p, {"s": v})) == 2 * v + (-(2 * v) % 3)


def test_monomial_divisor_peels_an_int_part():
    # a window's row over symbolic windows: (512*w + 128*i + 32*j + k) // (2048*d*d) does not
    # depend on i, j, k (which stay below 512), so a row reduction hoists out of their loops
    d = sym.dim("d", 1, 50)
    w, i, j, k = (sym.var(n, 0, hi) for n, hi in (("w", 9999), ("i", 3), ("j", 3), ("k", 31)))
    r = sym.add(sym.add(sym.mul(512, w), sym.mul(128, i)), sym.add(sym.mul(32, j), k))
    b = sym.mul(2048, sym.mul(d, d))
    q, m = sym.floordiv(r, b), sym.mod(r, b)
    assert sym.var_names(q) == {"w", "d"}
    rng = __import__("random").Random(0)
    for _ in range(300):
        env = {"d": rng.randint(1, 50), "w": rng.randint(0, 9999), "i": rng.randint(0, 3),
               "j": rng.randint(0, 3), "k": rng.randint(0, 31)}  # fmt: skip
        rv, bv = sym.as_int(sym.substitute(r, env)), sym.as_int(sym.substitute(b, env))
        assert sym.as_int(sym.substitute(q, env)) == rv // bv
        assert sym.as_int(sym.substitute(m, env)) == rv % bv


def test_a_size_halved_twice_indexes_within_one_halved_once():
    """A stride-2 downsampling under a symbolic size (s // 4 pixels, then s // 8): a window
    index 2 * i + j (i < s // 8, j < 2) is below s // 4, so flattening and unflattening it
    leaves no division; the bounds behind it hold at every size."""
    s = sym.dim("s", 1, 4096)
    half, quarter = sym.floordiv(s, 4), sym.floordiv(s, 8)
    i, j = sym.index_var(2, quarter), sym.index_var(5, 2)
    i1, j1 = sym.index_var(1, quarter), sym.index_var(4, 2)
    r = sym.add(sym.mul(i, 2), j)
    assert sym.prove_lt(r, half)
    assert sym.floordiv(r, half) == 0 and sym.mod(r, half) is r
    row = sym.add(sym.add(sym.mul(i1, sym.mul(half, 2)), sym.mul(j1, half)), r)
    assert sym.floordiv(row, sym.mul(half, half)) == 0
    assert sym.mod(sym.floordiv(row, half), half) == sym.add(sym.mul(i1, 2), j1)
    # the bounds used: 2 * (y // 8) <= y // 4, and with a nonnegative factor alongside
    for y in range(-40, 200):
        for k in range(0, 5):
            assert 2 * (y // 8) * k <= (y // 4) * k
    lhs = sym.add(sym.mul(half, half), sym.mul(sym.mul(quarter, half), -2))
    assert sym.prove_nonneg(lhs)
    assert not sym.prove_nonneg(sym.add(sym.mul(half, half), sym.mul(sym.mul(quarter, half), -3)))


def test_nested_window_sizes_compare_equal():
    """A strided conv after a strided conv: ((s + 3) // 4 + 1) // 2 is (s + 7) // 8, the form
    torch writes, so a reshape between the two spellings is a view; checked at every size."""
    s = sym.dim("s", 1, 4096)
    nested = sym.floordiv(sym.add(sym.floordiv(sym.add(s, 3), 4), 1), 2)
    assert nested == sym.floordiv(sym.add(s, 7), 8)
    for k in (-3, 0, 2):
        e = sym.floordiv(sym.add(sym.floordiv(sym.add(s, 5), 3), k), 4)
        for v in range(0, 300):
            assert sym.evaluate(e, {"s": v}) == ((v + 5) // 3 + k) // 4


def test_a_group_of_channels_over_a_symbolic_image_reads_contiguously():
    """A group norm's sum over (channels of a group, h, w) with h = w = s // 2: the group's
    channel c*8 + i // (4*h*h) is below 64 (its modulo goes), and the split of i into
    (row, column) by the symbolic width merges back, so the read is i plus a row offset.
    Checked by evaluation at every size."""
    s = sym.dim("s", 1, 4096)
    h = sym.floordiv(s, 2)
    i = sym.index_var(0, sym.mul(32, sym.mul(h, h)))
    g = sym.index_var(1, 8)
    hh = sym.mul(h, h)
    chan = sym.add(sym.mul(g, 8), sym.floordiv(i, sym.mul(4, hh)))
    assert sym.sym_upper(sym.floordiv(i, sym.mul(4, hh))) == 7
    assert sym.mod(chan, 64) is chan
    row = sym.mod(sym.floordiv(i, sym.mul(2, h)), sym.mul(2, h))
    index = sym.add(
        sym.add(sym.mul(sym.mul(4, hh), sym.mod(chan, 64)), sym.mul(sym.mul(2, h), row)),
        sym.mod(i, sym.mul(2, h)),
    )
    assert index == sym.add(i, sym.mul(32, sym.mul(g, hh)))
    split = sym.add(sym.mul(sym.mul(2, h), row), sym.mod(i, sym.mul(2, h)))
    for sv in (2, 3, 6, 9):
        hv = sv // 2
        for iv in range(0, 32 * hv * hv, 7):
            env = {"s": sv, "_i0": iv, "_i1": 5}
            assert sym.evaluate(split, env) == iv % (4 * hv * hv)
            assert sym.evaluate(index, env) == iv + 32 * 5 * hv * hv
