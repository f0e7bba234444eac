"""What a transformers LED (Longformer encoder-decoder) needs of the torch backend, op by op
against eager at odd and changing sizes: ``as_strided`` of a strided base (Longformer's
sliding chunks), a view whose size divides only under a guard, ``copy_`` from a value of
another shape (broadcast, or equal only under that guard) and into a strided input, and an
int argument that is 0 at run time. Then the tiny LED itself (``-m slow``).
"""

import warnings

import pytest

torch = pytest.importorskip("torch")

import luminal.torch_backend as lt  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


def _compiled(fn):
    return torch.compile(fn, backend="luminal", dynamic=True)


def _no_eager():
    assert lt.stats.eager_ops == {}, lt.stats.eager_ops
    assert lt.stats.failed_plans == 0, lt.stats.fallbacks
    assert lt.stats.fallbacks == []


def _compiles_once(calls):
    """Run each call; the ones after the first compile nothing new."""
    calls[0]()
    compiles = lt.stats.compiles
    for c in calls[1:]:
        c()
    assert lt.stats.compiles == compiles


def _chunks(h: torch.Tensor, w: int) -> torch.Tensor:
    """Longformer's ``_chunk``: overlapping windows of 2w rows every w rows, as a view."""
    h = h.reshape(h.size(0), h.size(1) // (2 * w), 2 * w, h.size(2))
    size = list(h.size())
    size[1] = size[1] * 2 - 1
    stride = list(h.stride())
    stride[1] = stride[1] // 2
    return h.as_strided(size=size, stride=stride)


def test_as_strided_of_a_transposed_input():
    # the base is the graph's input itself, transposed in memory (LED's layers receive the
    # query so after a graph break): its storage order is not its logical order
    def f(q):
        return _chunks(q, 4) * 2.0

    g = _compiled(f)
    with torch.no_grad():
        for n, bh in ((24, 3), (40, 5)):
            q = torch.randn(n, bh, 7).transpose(0, 1)  # (bh, n, 7), strides (7, 7 * bh, 1)
            got = g(q)
            torch.testing.assert_close(got, f(q), rtol=0, atol=0)
            if n == 24:
                compiles = lt.stats.compiles
    assert lt.stats.compiles == compiles  # the second size compiled nothing new
    _no_eager()


def test_as_strided_of_a_view_of_an_intermediate():
    # Longformer's heads: (seq, batch, heads x d) to (batch x heads, seq, d), a copy in eager
    # (transposes, then a reshape): the chunks address that copy's storage
    def f(x):
        s, b = x.shape[:2]
        y = (x + 1.0).view(s, b, 2, 3).transpose(0, 1).transpose(1, 2).reshape(b * 2, s, 3)
        return _chunks(y, 2).sum(-1)

    g = _compiled(f)
    with torch.no_grad():
        for shape in ((12, 2, 6), (20, 3, 6), (8, 5, 6)):
            x = torch.randn(*shape)
            torch.testing.assert_close(g(x), f(x))
    _no_eager()


def test_as_strided_over_a_symbolic_window_checks_its_reads_per_call():
    # chunks already cut (LED's attention probabilities after a graph break): the window
    # 2w is a size of the input, the stride w = 2w // 2 a floor division, and the bound of
    # the last element read is checked at each call rather than proved
    def f(p):
        size = [p.size(0), 2 * p.size(1) - 1, p.size(2), 1]
        stride = [p.stride(0), p.stride(1) // 2, 1, 1]
        return p.as_strided(size, stride) - 1.0

    g = _compiled(f)
    with torch.no_grad():
        for shape in ((3, 4, 8, 1), (2, 5, 12, 1), (5, 3, 7, 1)):
            p = torch.randn(*shape)
            torch.testing.assert_close(g(p), f(p), rtol=0, atol=0)
            if shape[0] == 3:
                compiles = lt.stats.compiles
    assert lt.stats.compiles == compiles
    _no_eager()


def test_as_strided_with_an_offset_past_a_strided_base():
    # the window starts past the start of a permuted base: the offset counts in storage
    def f(x):
        y = (x * 3.0).permute(2, 0, 1)  # storage order: x's
        return y.as_strided((2, 3), (x.size(2), 1), 5) + 1.0

    g = _compiled(f)
    with torch.no_grad():
        for shape in ((3, 5, 7), (4, 3, 9)):
            x = torch.randn(*shape)
            torch.testing.assert_close(g(x), f(x), rtol=0, atol=0)
    _no_eager()


def _with_extra_row(x):
    return torch.cat([x, x[:1] * 0.5], 0)  # s + 1 rows


def test_view_splitting_a_size_plus_one_by_a_guarded_divisor():
    # (s + 1, d) viewed as (b, (s + 1) // b, d), b the batch of another argument
    def f(x, y):
        z = _with_extra_row(x).view(y.shape[0], -1, x.shape[1])
        return z * y[:, :1, None]

    g = _compiled(f)
    with torch.no_grad():
        for n, b in ((5, 2), (11, 3), (14, 5)):
            x, y = torch.randn(n, 3), torch.randn(b, 4)
            torch.testing.assert_close(g(x, y), f(x, y), rtol=0, atol=0)
            if n == 5:
                compiles = lt.stats.compiles
    assert lt.stats.compiles == compiles
    _no_eager()


def test_copy_from_a_guarded_view():
    # the value's rows are b * ((s + 1) // b), the buffer's s + 1: equal under the guard
    def f(x, y):
        buf = torch.zeros(x.shape[0] + 1, x.shape[1])
        z = _with_extra_row(x).view(y.shape[0], -1, x.shape[1]) * 2.0
        buf.copy_(z.reshape(-1, x.shape[1]))
        return buf + 1.0

    g = _compiled(f)
    with torch.no_grad():

        def call(n, b):
            x, y = torch.randn(n, 3), torch.randn(b, 4)
            torch.testing.assert_close(g(x, y), f(x, y), rtol=0, atol=0)

        _compiles_once([lambda n=n, b=b: call(n, b) for n, b in ((5, 2), (11, 4), (8, 3))])
    _no_eager()


def test_copy_broadcasts_like_expand():
    def f(buf, x):
        buf.copy_(x.sum(0, keepdim=True))  # (1, d) into (n, d)
        return buf * 2.0

    g = _compiled(f)
    with torch.no_grad():

        def call(n, d):
            x = torch.randn(n, d)
            want_buf, got_buf = torch.zeros(n, d), torch.zeros(n, d)
            want = f(want_buf, x)
            torch.testing.assert_close(g(got_buf, x), want)
            torch.testing.assert_close(got_buf, want_buf)

        _compiles_once([lambda n=n, d=d: call(n, d) for n, d in ((3, 5), (7, 2), (4, 9))])
    _no_eager()


def test_copy_into_a_strided_input():
    # a transposed input cannot be the plan's memory: the plan computes the new value and the
    # partition copies it into the tensor
    def f(buf, x):
        buf.copy_(buf + x[:, None, :])
        return buf.sum(1)

    g = _compiled(f)
    with torch.no_grad():

        def call(n, k):
            x = torch.randn(n, 9)
            start = torch.randn(k, n, 9)
            want_buf = start.clone().transpose(0, 1)
            got_buf = start.clone().transpose(0, 1)
            want = f(want_buf, x)
            torch.testing.assert_close(g(got_buf, x), want)
            torch.testing.assert_close(got_buf, want_buf, rtol=0, atol=0)

        _compiles_once([lambda n=n, k=k: call(n, k) for n, k in ((3, 5), (6, 7), (11, 2))])
    _no_eager()


def test_int_argument_zero_at_run_time():
    # dynamo's range for an int argument holds 0 (LED's positions start at
    # past_key_values_length); a negative one has no plan and that call runs in eager
    emb = torch.nn.Embedding(40, 4)

    def f(x, start):
        return emb(torch.arange(start, start + x.shape[1])) + x[..., None]

    g = _compiled(f)
    with torch.no_grad():
        for start, n in ((3, 7), (0, 7), (0, 5), (9, 11)):
            x = torch.randn(2, n)
            torch.testing.assert_close(g(x, start), f(x, start))
        compiles = lt.stats.compiles
        _no_eager()

        def h(x, start):
            return x + torch.arange(start, start + x.shape[1])

        gh = _compiled(h)
        x = torch.randn(2, 5)
        for start in (4, 0, -3, 2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.testing.assert_close(gh(x, start), h(x, start))
            assert any("negative" in str(w.message) for w in caught) == (start < 0)
    assert lt.stats.compiles == compiles + 1
    assert lt.stats.failed_plans == 0


def _led():
    tf = pytest.importorskip("transformers")
    cfg = tf.LEDConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, attention_window=8, max_encoder_position_embeddings=256,
        max_decoder_position_embeddings=256,
    )  # fmt: skip
    return tf.LEDForConditionalGeneration(cfg).eval()


@pytest.mark.slow
def test_led_forward_runs_in_luminal():
    model = _led()
    fast = torch.compile(model, backend="luminal", dynamic=True)
    with torch.no_grad():
        for s, t in ((13, 7), (21, 5)):  # padded to 16 and 24 tokens: windows of 8
            ids = torch.randint(3, 100, (2, s))
            dec = torch.randint(3, 100, (2, t))
            want = model(input_ids=ids, decoder_input_ids=dec).logits
            got = fast(input_ids=ids, decoder_input_ids=dec).logits
            assert (got - want).abs().max().item() < 1e-4
    _no_eager()
