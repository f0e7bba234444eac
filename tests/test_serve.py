"""luminal serve end to end: a server on a free loopback port, driven by the official
``openai`` client (and httpx for malformed requests). The model is a small random Llama
(SmolLM2's tokenizer) saved as a transformers folder; embeddings use all-MiniLM-L6-v2."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from luminal.models.llama import LlamaSession, load_hf_dir  # noqa: E402
from luminal.serve.app import create_app  # noqa: E402
from luminal.serve.cli import server as http_server  # noqa: E402
from luminal.serve.engine import EmbedEngine, LLMEngine  # noqa: E402
from luminal.serve.limits import Limits  # noqa: E402
from luminal.serve.metrics import Metrics  # noqa: E402

CTX = 96
STEP = 8  # tokens per batched step: most prompts take several steps
MODEL = "tiny-llama"
EMBED = "minilm"


def make_tiny_llama(d: str, seed: int = 0) -> None:
    """A random 2-layer Llama (GQA) with SmolLM2's tokenizer and chat template."""
    from safetensors.numpy import save_file

    from luminal.loaders.gguf import GGUFFile
    from luminal.models import smollm2_path
    from luminal.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(smollm2_path()))
    vocab, hidden, inter, heads, kv, layers = tok.vocab_size, 64, 96, 4, 2, 2
    hd = hidden // heads
    r = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (r.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    ws = {
        "model.embed_tokens.weight": r.standard_normal((vocab, hidden)).astype(np.float32),
        "model.norm.weight": np.ones(hidden, np.float32),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        ws[p + "self_attn.q_proj.weight"] = mat(hidden, hidden)
        ws[p + "self_attn.k_proj.weight"] = mat(kv * hd, hidden)
        ws[p + "self_attn.v_proj.weight"] = mat(kv * hd, hidden)
        ws[p + "self_attn.o_proj.weight"] = mat(hidden, hidden)
        ws[p + "mlp.gate_proj.weight"] = mat(inter, hidden)
        ws[p + "mlp.up_proj.weight"] = mat(inter, hidden)
        ws[p + "mlp.down_proj.weight"] = mat(hidden, inter)
        ws[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        ws[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    os.makedirs(d, exist_ok=True)
    save_file(ws, os.path.join(d, "model.safetensors"))
    config = {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "max_position_embeddings": CTX,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(config, fh)
    tok.tk.save(os.path.join(d, "tokenizer.json"))
    eos = tok.tk.id_to_token(tok.eos_ids[0])
    with open(os.path.join(d, "tokenizer_config.json"), "w") as fh:
        json.dump({"eos_token": eos, "chat_template": tok.chat_template}, fh)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Running:
    """A server in a thread of this process."""

    def __init__(
        self,
        model_dir: str | None,
        embed_dir: str | None,
        limits: Limits,
        backend: str = "auto",
        f32_batch: int = 0,
        step_tokens: int = STEP,
        prefill: str = "chunked",
    ) -> None:
        self.metrics = Metrics()
        self.llm = None
        if model_dir is not None:
            self.llm = LLMEngine(
                model_dir,
                MODEL,
                limits,
                self.metrics,
                backend,
                True,
                f32_batch,
                step_tokens,
                prefill,
            )
            self.llm.start()
        self.embed = None
        if embed_dir is not None:
            self.embed = EmbedEngine(embed_dir, EMBED, limits, self.metrics, quiet=True)
            self.embed.start()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(self.llm, self.embed, limits, self.metrics)
        engines = [self.llm] if self.llm is not None else []
        self.server = http_server(app, engines, "127.0.0.1", self.port, limits.shutdown_grace)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/health").json())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if self.embed is not None:
            self.embed.embedder = None


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("safetensors")
    d = str(tmp_path_factory.mktemp("tiny_llama"))
    make_tiny_llama(d)
    return d


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One plan cache for the module: its servers share the tiny model's plans (a reload
    after idle must find them there)."""
    d = str(tmp_path_factory.mktemp("serve_plans"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LUMINAL_PLAN_CACHE_DIR", d)
        yield d


@pytest.fixture(scope="module")
def server(tiny_dir: str, plans: str) -> Iterator[Running]:
    from luminal.models import minilm_dir

    limits = Limits(
        max_context=CTX, max_tokens=40, max_seqs=4, max_queue=32, max_request_bytes=4096
    )
    s = Running(tiny_dir, minilm_dir(), limits, f32_batch=3)  # steps of 3+ on the f32 plan
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(tiny_dir: str, plans: str) -> Iterator[Any]:
    """Greedy text of the tiny model with a LlamaSession (what ``luminal generate`` runs)."""
    model, tok = load_hf_dir(tiny_dir, CTX)
    held = {"session": LlamaSession(model, "auto")}

    def greedy(ids: list[int], n: int) -> str:
        session = held["session"]
        session.reset()
        logits = session.forward(ids)
        out: list[int] = []
        while len(out) < n:
            t = int(np.argmax(logits))
            if t in tok.eos_ids:
                break
            out.append(t)
            if len(out) == n:
                break
            logits = session.forward([t])
        return str(tok.decode(out))

    greedy.tokenizer = tok  # type: ignore[attr-defined]
    yield greedy
    held.clear()


def test_models_and_health(server: Running) -> None:
    ids = [m.id for m in server.client.models.list()]
    assert ids == [MODEL, EMBED]
    h = server.health()
    assert h["status"] == "ok" and h["models"][MODEL]["loaded"] is True


def test_completion_greedy_equals_llama_session(server: Running, reference: Any) -> None:
    prompt = "The quick brown fox"
    r = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    ids = reference.tokenizer.encode(prompt)
    assert r.choices[0].text == reference(ids, 12)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"


def test_chat_and_chat_stream(server: Running, reference: Any) -> None:
    msgs = [{"role": "user", "content": "Write a haiku about compilers"}]
    tok = reference.tokenizer
    ids = tok.encode(tok.apply_chat_template(msgs))
    want = reference(ids, 10)
    r = server.client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=10, temperature=0
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(ids)
    stream = server.client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, reasons, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(pieces) == want
    assert reasons[-1] == "length" and usage is not None and usage.completion_tokens == 10


def test_completion_stream_stop_and_seed(server: Running, reference: Any) -> None:
    ids = reference.tokenizer.encode("Once upon a time")
    full = reference(ids, 20)
    stop = full[5:8]  # a stop string inside the greedy text: output ends just before it
    assert stop
    text = "".join(
        c.choices[0].text
        for c in server.client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=20,
            temperature=0,
            stop=[stop],
            stream=True,
        )
    )
    assert text == full[: full.index(stop)]
    # sampling with a seed is reproducible
    a, b = (
        server.client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=8, temperature=0.9, top_p=0.9, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    )
    assert a == b


def test_stop_string_while_others_decode(server: Running, reference: Any) -> None:
    """A stop string ends a stream whose next token is already in the step running beside
    the check (the engine overlaps a step's text work with the next step): its text still
    ends before the stop string, the other streams are unchanged, and the slot claims only
    the keys and values of the tokens it returned."""
    eng = server.llm
    assert eng is not None and eng.loaded is not None
    ids = reference.tokenizer.encode("Once upon a time")
    full = reference(ids, 20)
    stop = full[5:8]
    others = ["word " * k + "end" for k in (2, 7, 11)]
    want = [reference(reference.tokenizer.encode(p), 30) for p in others]
    got: dict[int, str] = {}
    begun = [threading.Event() for _ in others]
    submitted: list[Any] = []
    submit = eng.submit

    def record(r: Any) -> None:
        submitted.append(r)
        submit(r)

    def run(i: int) -> None:
        kw: dict[str, Any] = {"stop": [stop], "max_tokens": 20} if i < 0 else {"max_tokens": 30}
        r = server.client.completions.create(
            model=MODEL,
            prompt="Once upon a time" if i < 0 else others[i],
            temperature=0,
            stream=True,
            **kw,
        )
        text = ""
        for c in r:
            text += c.choices[0].text
            if i >= 0 and text:
                begun[i].set()
        got[i] = text

    eng.submit = record  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(others))]
        for t in threads:
            t.start()
        for e in begun:  # the others decode; the stopped one takes the last slot
            e.wait(timeout=30)
        run(-1)
        for t in threads:
            t.join(timeout=60)
    finally:
        del eng.submit
    assert got[-1] == full[: full.index(stop)]
    assert [got[i] for i in range(len(others))] == want
    q = next(r for r in submitted if r.stop == [stop])
    assert eng.resident.get(q.slot) is q
    assert q.finished and len(q.tokens) < 20 and q.pos == len(q.prompt) + len(q.tokens) - 1
    held = (q.prompt + q.tokens)[: q.pos]
    session = LlamaSession(eng.loaded.model, "auto")
    session.forward(held)
    for name, rows in eng.loaded.decoder.slot_view(eng.loaded.cache, q.slot).items():
        np.testing.assert_allclose(
            rows[: len(held)], session.cache[name][: len(held)], atol=1e-3, err_msg=name
        )


def test_sixteen_concurrent_streams(server: Running, reference: Any) -> None:
    prompts = [f"Item number {i} is" for i in range(16)]
    want = [reference(reference.tokenizer.encode(p), 8) for p in prompts]
    got: list[str | None] = [None] * 16

    def run(i: int) -> None:
        s = server.client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=8, temperature=0, stream=True
        )
        got[i] = "".join(c.choices[0].text for c in s)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == want
    metrics = httpx.get(server.url + "/metrics").text
    # 16 requests over 4 slots: some steps decoded several sequences together
    sizes = [line for line in metrics.splitlines() if line.startswith("luminal_batch_size_bucket")]
    le1 = next(float(x.split()[-1]) for x in sizes if 'le="1.0"' in x)
    total = next(float(x.split()[-1]) for x in sizes if 'le="+Inf"' in x)
    assert total > le1


def test_concurrent_prompts_equal_the_same_served_one_by_one(
    server: Running, reference: Any
) -> None:
    # prompt lengths from 1 token to several steps' worth, more requests than slots: prompts
    # are prefilled in chunks, beside other streams' decode tokens, in whichever slots
    prompts = ["word " * k + "end" for k in (0, 3, 9, 17, 30, 44, 5, 23)]

    def complete(p: str) -> str:
        r = server.client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
        return str(r.choices[0].text)

    alone = [complete(p) for p in prompts]
    assert alone == [reference(reference.tokenizer.encode(p), 8) for p in prompts]
    together: list[str | None] = [None] * len(prompts)

    def run(i: int) -> None:
        together[i] = complete(prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert together == alone


def prompt_reused(s: Running) -> float:
    m = httpx.get(s.url + "/metrics").text
    line = next(x for x in m.splitlines() if x.startswith("luminal_prompt_tokens_reused_total"))
    return float(line.split()[-1])


def check_shared_prefixes_are_reused(s: Running, tiny_dir: str, reference: Any) -> None:
    """Prompts that begin alike, one by one (each finds the one before in a slot) and
    together (rows copied between slots): the tokens and log-probabilities of each prompt
    run alone by a ``LlamaSession``."""
    system = "You are a terse assistant; answer in one short line please. "
    asks = ["Why is the sky blue?", "Name a river.", "Count to three.", "Say hi.", "Rain?"]
    prompts = [system + q for q in asks]
    tok = reference.tokenizer
    shared = len(tok.encode(system)) - 2  # the seam may tokenize otherwise
    model, _ = load_hf_dir(tiny_dir, CTX)
    session = LlamaSession(model, "auto")
    want: list[tuple[str, list[float]]] = []
    for p in prompts:
        session.reset()
        logits, lps, out = session.forward(tok.encode(p)), [], []
        for _ in range(6):
            t = int(np.argmax(logits))
            lps.append(float(_log_softmax(logits)[t]))
            out.append(t)
            logits = session.forward([t])
        want.append((str(tok.decode(out)), lps))

    def complete(p: str) -> tuple[str, list[float]]:
        r = s.client.completions.create(
            model=MODEL, prompt=p, max_tokens=6, temperature=0, logprobs=1, stop=["\u2603"]
        )
        return str(r.choices[0].text), list(r.choices[0].logprobs.token_logprobs)

    def check(got: list[Any]) -> None:
        for (text, lps), (want_text, want_lps) in zip(got, want, strict=True):
            assert text == want_text
            assert lps == pytest.approx(want_lps, abs=1e-3)

    before = prompt_reused(s)
    check([complete(p) for p in prompts])
    assert prompt_reused(s) - before >= (len(prompts) - 1) * shared
    together: list[Any] = [None] * len(prompts)

    def run(i: int) -> None:
        together[i] = complete(prompts[i])

    # slow steps: the requests overlap, so they take other slots and copy the rows there
    assert s.llm is not None and s.llm.loaded is not None
    decoder = s.llm.loaded.decoder
    step = decoder.step

    def slow(*args: Any, **kw: Any) -> Any:
        time.sleep(0.03)
        return step(*args, **kw)

    decoder.step = slow  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        del decoder.step
    check(together)
    # every slot holds what its last sequence's tokens give when run afresh (this tiny
    # model's text hardly depends on earlier tokens: the rows themselves are compared)
    eng, lo = s.llm, s.llm.loaded
    copied = [q for slot, q in eng.resident.items() if slot != 0]
    assert copied, "the requests did not overlap"
    for slot, q in eng.resident.items():
        held = (q.prompt + q.tokens)[: q.pos]
        session.reset()
        session.forward(held)
        for name, rows in decoder.slot_view(lo.cache, slot).items():
            np.testing.assert_allclose(
                rows[: len(held)], session.cache[name][: len(held)], atol=1e-3, err_msg=name
            )


def test_shared_prefixes_are_reused_chunked(server: Running, tiny_dir: str, reference: Any) -> None:
    check_shared_prefixes_are_reused(server, tiny_dir, reference)


def test_serial_prefill_gives_the_same_text(tiny_dir: str, reference: Any) -> None:
    # prompts prefilled one by one through the prefill plan instead of as rows of the steps
    limits = Limits(max_context=CTX, max_tokens=40, max_seqs=4)
    s = Running(tiny_dir, None, limits, f32_batch=3, prefill="serial")
    try:
        assert s.llm is not None and s.llm.loaded is not None
        assert s.llm.loaded.prefill is not None
        prompts = ["word " * k + "end" for k in (0, 9, 30, 44, 5, 23)]
        got: list[str | None] = [None] * len(prompts)

        def run(i: int) -> None:
            r = s.client.completions.create(
                model=MODEL, prompt=prompts[i], max_tokens=8, temperature=0
            )
            got[i] = r.choices[0].text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert got == [reference(reference.tokenizer.encode(p), 8) for p in prompts]
        # such a request is prefilled as rows of the steps even here
        echo_logprobs_match_the_model(s.client, tiny_dir, reference)
    finally:
        s.stop()
    with pytest.raises(ValueError, match="prefill must be"):
        LLMEngine(tiny_dir, MODEL, limits, Metrics(), prefill="both")
    with pytest.raises(ValueError, match="step_tokens must be"):
        LLMEngine(tiny_dir, MODEL, limits, Metrics(), step_tokens=0)


def test_cancel_during_prefill_frees_the_slots(server: Running, reference: Any) -> None:
    """Requests cancelled while their prompts are part-way into their slots end without
    text and free the slots; the requests beside them are unaffected."""
    import asyncio

    from luminal.sampling import Sampler
    from luminal.serve.engine import GenRequest

    eng = server.llm
    assert eng is not None and eng.loaded is not None
    tok = reference.tokenizer
    short = [tok.encode("A short one"), tok.encode("And another")]
    long = [tok.encode("word " * 50), tok.encode("thing " * 50)]
    assert all(len(p) > 3 * STEP for p in long)
    loop = asyncio.new_event_loop()  # run below, once, to deliver the events
    reqs = [GenRequest(p, 6, Sampler(0.0), [], loop) for p in short + long]
    seen: list[int] = []
    decoder = eng.loaded.decoder
    step = decoder.step

    def watch(*args: Any, **kw: Any) -> Any:  # runs in the engine thread before each step
        r = reqs[2]
        if 0 < r.pos < len(r.prompt) and not r.cancelled.is_set():
            seen.append(r.pos)
            reqs[2].cancel()
            reqs[3].cancel()
        return step(*args, **kw)

    decoder.step = watch  # type: ignore[method-assign]
    try:
        with eng.cv:  # all four are admitted in one iteration
            for r in reqs:
                eng.submit(r)
        deadline = time.monotonic() + 30
        while server.health()["models"][MODEL]["active"] or eng.pending:
            assert time.monotonic() < deadline, "a cancelled request still holds its slot"
            time.sleep(0.02)
    finally:
        del decoder.step
    assert seen, "the long prompt was never seen part-way through its prefill"

    loop.run_until_complete(asyncio.sleep(0.01))

    def events(r: GenRequest) -> list[tuple[str, Any]]:
        out = []
        while not r.events.empty():
            out.append(r.events.get_nowait())
        return out

    for r, p in zip(reqs[:2], short, strict=True):
        ev = events(r)
        assert ev[-1] == ("done", "length")
        assert "".join(v for k, v in ev if k == "text") == reference(p, 6)
    for r in reqs[2:]:
        assert r.generated == 0 and not any(k == "text" for k, _ in events(r))
    loop.close()
    # the freed slots serve the next requests (stale rows of the cancelled prompts masked)
    r2 = server.client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0)
    assert r2.choices[0].text == reference(tok.encode("Hi"), 5)


def test_n_choices(server: Running, reference: Any) -> None:
    ids = reference.tokenizer.encode("Once upon a time")
    r = server.client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, n=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [reference(ids, 6)] * 2
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 12
    # sampled with a seed: choice i is what n=1 gives with seed + i
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 1.5}
    msgs = [{"role": "user", "content": "Say something"}]
    many = server.client.chat.completions.create(messages=msgs, n=3, seed=11, **kw)
    singles = [
        server.client.chat.completions.create(messages=msgs, seed=11 + i, **kw)
        .choices[0]
        .message.content
        for i in range(3)
    ]
    assert [c.message.content for c in many.choices] == singles
    assert len(set(singles)) > 1  # the choices differ
    streamed: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    for chunk in server.client.chat.completions.create(
        messages=msgs, n=3, seed=11, stream=True, **kw
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    assert [streamed[i] for i in range(3)] == singles
    assert all(reasons[i] for i in range(3))


def test_logprobs(server: Running, reference: Any, tiny_dir: str) -> None:
    prompt = "The quick brown fox"
    tok = reference.tokenizer
    ids = tok.encode(prompt)
    r = server.client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3
    )
    c = r.choices[0]
    lp = c.logprobs
    assert c.text == reference(ids, 6)
    assert "".join(lp.tokens) == c.text and len(lp.tokens) == 6
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    for t, x, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert x <= 0 and len(top) == 3
        assert max(top.values()) == pytest.approx(x)  # greedy: the likeliest token
        assert top[t] == pytest.approx(x)
    # the first token's log-probability from the model itself
    model, _ = load_hf_dir(tiny_dir, CTX)
    logits = np.asarray(LlamaSession(model, "interp").forward(ids), np.float64).reshape(-1)
    want = -np.log(np.exp(logits - logits.max()).sum())  # the argmax's log-softmax
    assert lp.token_logprobs[0] == pytest.approx(want, abs=1e-3)
    # chat, streamed: each token's logprobs come with its text
    msgs = [{"role": "user", "content": "Write a haiku about compilers"}]
    want_text = reference(tok.encode(tok.apply_chat_template(msgs)), 5)
    text, content = "", []
    for chunk in server.client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    ):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs is not None and ch.logprobs.content:
                content += ch.logprobs.content
    assert text == want_text
    assert "".join(e.token for e in content) == text
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)
    assert all(bytes(e.bytes).decode() == e.token for e in content)


def test_echo(server: Running, reference: Any) -> None:
    prompt = "Echo this back"
    ids = reference.tokenizer.encode(prompt)
    want = prompt + reference(ids, 5)
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "temperature": 0, "echo": True}
    r = server.client.completions.create(prompt=prompt, **kw)
    assert r.choices[0].text == want
    streamed = "".join(c.choices[0].text for c in server.client.completions.create(
        prompt=prompt, stream=True, **kw))  # fmt: skip
    assert streamed == want
    by_ids = server.client.completions.create(prompt=ids, **kw)
    assert by_ids.choices[0].text == reference.tokenizer.decode(ids) + reference(ids, 5)


def _log_softmax(logits: Any) -> np.ndarray:
    x = np.asarray(logits, np.float64).reshape(-1)
    return np.asarray(x - x.max() - np.log(np.exp(x - x.max()).sum()))


def echo_logprobs_match_the_model(client: Any, tiny_dir: str, reference: Any) -> None:
    """Echo with logprobs: the prompt's tokens (the first without a logprob), each with its
    log-probability given the tokens before it, then the completion's."""
    prompt = "The prompt of this request spans more than two steps of rows: " + "word " * 12
    ids = reference.tokenizer.encode(prompt)
    assert len(ids) > 2 * STEP
    kw: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    r = client.completions.create(echo=True, logprobs=2, **kw)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt + reference(ids, 4)
    assert len(lp.tokens) == len(ids) + 4 and lp.text_offset[0] == 0
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    model, _ = load_hf_dir(tiny_dir, CTX)
    session = LlamaSession(model, "interp")
    for j in range(len(ids) - 1):
        want = _log_softmax(session.forward([ids[j]]))
        assert lp.token_logprobs[j + 1] == pytest.approx(want[ids[j + 1]], abs=1e-3)
        assert max(lp.top_logprobs[j + 1].values()) == pytest.approx(want.max(), abs=1e-3)
    plain = client.completions.create(logprobs=2, **kw).choices[0].logprobs
    assert lp.token_logprobs[len(ids) :] == pytest.approx(plain.token_logprobs, abs=1e-4)


def test_echo_with_logprobs(server: Running, tiny_dir: str, reference: Any) -> None:
    echo_logprobs_match_the_model(server.client, tiny_dir, reference)


def _completion_tokens(server: Running) -> float:
    m = httpx.get(server.url + "/metrics").text
    return float(
        next(x for x in m.splitlines() if x.startswith("luminal_completion_tokens_total")).split()[
            -1
        ]
    )


def test_disconnect_stops_generation_and_frees_the_slot(server: Running) -> None:
    assert server.llm is not None
    before = _completion_tokens(server)
    body = {
        "model": MODEL,
        "prompt": "Tell me a long story",
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        next(x for x in r.iter_lines() if x.startswith("data:"))
        # hold the engine between steps (its loop takes this lock each iteration) while the
        # client goes away, so the generation cannot simply run to its end first
        server.llm.cv.acquire()
    try:
        time.sleep(0.5)
    finally:
        server.llm.cv.release()
    deadline = time.monotonic() + 10
    while server.health()["models"][MODEL]["active"]:
        assert time.monotonic() < deadline, "the disconnected stream still holds its slot"
        time.sleep(0.02)
    assert _completion_tokens(server) - before < 40  # it stopped before max_tokens


def test_embeddings_match_the_embedder(server: Running) -> None:
    from luminal.models import Bert, Embedder, minilm_dir
    from luminal.tokenizer import Tokenizer

    texts = ["a first sentence", "and another, longer sentence about compilers"]
    d = minilm_dir()
    emb = Embedder(Bert.from_dir(d), Tokenizer.from_file(os.path.join(d, "tokenizer.json")))
    want = emb(texts)
    for fmt in ("float", "base64"):  # the openai client decodes base64 itself
        r = server.client.embeddings.create(model=EMBED, input=texts, encoding_format=fmt)
        got = np.array([_vector(e.embedding) for e in r.data])
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= 0.9999
        assert r.usage.prompt_tokens > 0


def _vector(e: Any) -> np.ndarray:
    if isinstance(e, str):  # asked for base64 explicitly, the client leaves it encoded
        return np.frombuffer(base64.b64decode(e), "<f4")
    return np.asarray(e, np.float32)


BAD: list[tuple[str, Any, int, str]] = [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "'model'"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "role",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        400,
        "content",
    ),
    (
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        404,
        "does not exist",
    ),
    (
        "/v1/chat/completions",
        {"model": EMBED, "messages": [{"role": "user", "content": "x"}]},
        400,
        "embedding model",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 41}, 400, "limit is 40"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 5}, 400, "n must be in [1, 4]"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n must be in"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "echo": True, "logprobs": 1, "stream": True},
        400,
        "echo with logprobs is not supported when streaming",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "y"}, 400, "suffix"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        400,
        "top_logprobs needs logprobs",
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "logprobs": True,
            "top_logprobs": 21,
        },
        400,
        "top_logprobs",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a"] * 5}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "one prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 10**9]}, 400, "out of range"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "empty"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 200}, 400, "context"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 5000}, 413, "limit"),
    ("/v1/embeddings", {"model": EMBED, "input": []}, 400, "empty"),
    ("/v1/embeddings", {"model": EMBED, "input": [""]}, 400, "empty"),
    ("/v1/embeddings", {"model": EMBED, "input": 3}, 400, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": "x"}, 400, "generates text"),
    (
        "/v1/embeddings",
        {"model": EMBED, "input": "x", "encoding_format": "hex"},
        400,
        "encoding_format",
    ),
    ("/v1/nothing", {}, 404, "Not Found"),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), BAD)
def test_bad_input_is_a_4xx_with_an_openai_error(
    server: Running, path: str, body: Any, status: int, words: str
) -> None:
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, headers={"content-type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"], err
    assert set(err) == {"message", "type", "param", "code"}
    if "context" in words:
        assert err["code"] == "context_length_exceeded"


def test_bad_input_through_the_openai_client(server: Running) -> None:
    with pytest.raises(openai.NotFoundError):
        server.client.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError, match="context"):
        server.client.completions.create(model=MODEL, prompt="word " * 200)
    assert httpx.get(server.url + "/v1/chat/completions").status_code == 405


def test_queue_limit_is_a_429_with_retry_after(tiny_dir: str) -> None:
    # the interpreter decodes slowly enough that two 80-token streams hold both slots
    limits = Limits(max_context=CTX, max_tokens=80, max_seqs=2, max_queue=1)
    s = Running(tiny_dir, None, limits, backend="interp")
    try:
        body = {
            "model": MODEL,
            "prompt": "Go on and on",
            "max_tokens": 80,
            "temperature": 0,
            "stream": True,
            "stop": ["\u2603"],
        }
        readers = []
        with ExitStack() as stack:
            for _ in range(2):
                r = stack.enter_context(
                    httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60)
                )
                lines = r.iter_lines()  # kept: httpx closes a stream whose iterator is dropped
                readers.append(lines)
                next(x for x in lines if x.startswith("data:"))
            queued = stack.enter_context(
                httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60)
            )
            assert queued.status_code == 200
            over = httpx.post(s.url + "/v1/completions", json=body)
            assert over.status_code == 429
            assert over.headers["retry-after"] == "1"
            assert over.json()["error"]["code"] == "queue_full"
    finally:
        s.stop()


def test_idle_unload_then_reload_from_the_plan_cache(server: Running, tiny_dir: str) -> None:
    # the same limits as the module's server: its plans are in the module's plan cache
    limits = Limits(max_context=CTX, max_tokens=40, max_seqs=4, idle_unload=1.0)
    s = Running(tiny_dir, None, limits)
    try:
        r = s.client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
        deadline = time.monotonic() + 20
        while s.health()["models"][MODEL]["loaded"]:
            assert time.monotonic() < deadline, "the model was not unloaded after idling"
            time.sleep(0.05)
        assert s.llm is not None and s.llm.loaded is None
        loads = len(s.llm.cold_starts)
        again = s.client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
        assert again.choices[0].text == r.choices[0].text
        assert len(s.llm.cold_starts) == loads + 1  # the request reloaded the model
        assert s.llm.loaded is not None and s.llm.loaded.runner.cached
        m = httpx.get(s.url + "/metrics").text

        def value(name: str) -> float:
            line = next(x for x in m.splitlines() if x.startswith(f'{name}{{model="{MODEL}"}}'))
            return float(line.split()[-1])

        loads = value("luminal_model_loads_total")
        assert loads == len(s.llm.cold_starts)
        # every load after the first followed an unload (one more may have come since)
        assert loads - 1 <= value("luminal_model_unloads_total") <= loads
        assert f'luminal_cold_start_seconds{{model="{MODEL}"}}' in m
    finally:
        s.stop()


def test_shutdown_drains_then_cancels(tiny_dir: str) -> None:
    # interpreter: an 80-token stream outlives the 0.5 s grace, so shutdown cancels it
    limits = Limits(max_context=CTX, max_tokens=80, max_seqs=2, shutdown_grace=0.5)
    s = Running(tiny_dir, None, limits, backend="interp")
    body = {
        "model": MODEL,
        "prompt": "Go on and on",
        "max_tokens": 80,
        "temperature": 0,
        "stream": True,
    }
    try:
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(x for x in lines if x.startswith("data:"))
            s.server.should_exit = True
            rest = list(lines)
        events = [x.removeprefix("data: ") for x in rest if x.startswith("data:")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "cancelled"
        s.thread.join(timeout=30)
        assert not s.thread.is_alive()
        assert s.llm is not None and not s.llm.thread.is_alive()
    finally:
        s.stop()
