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
