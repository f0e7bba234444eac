"""bench/llm.py runs end to end (--quick, torch.compile skipped) and ends with the JSON summary
(no timing assertions)."""

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")

REQUIRED = (
    "decode_tok_s",
    "decode_vs_llamacpp",
    "prefill_tok_s",
    "prefill_vs_torch_eager",
    "decode_frac_roofline",
    "minilm_b32_vs_onnxruntime",
)


@pytest.mark.slow  # compiles SmolLM2 and MiniLM (minutes on 2 cores with a cold kernel cache)
def test_quick_ends_with_json_summary(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from luminal.models import minilm_dir, smollm2_path

    try:
        smollm2_path(), minilm_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")  # the bench must re-exec without it
    out = tmp_path / "llm.json"
    p = subprocess.run(
        [sys.executable, os.path.join(BENCH, "llm.py"), "--quick", "--skip", "torch_compile",
         "--json-out", str(out)],
        capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == summary
    for key in REQUIRED:
        assert key in summary, key
    assert summary["blas_env_was_set"] == ["OPENBLAS_CORETYPE"]
    assert "OPENBLAS_CORETYPE" in p.stdout
    assert summary["threads"] == 2
    assert summary["decode_tok_s"] > 0 and summary["prefill_tok_s"] > 0
    assert 0 < summary["decode_frac_roofline"]
    assert summary["skipped"]["llm.torch_compile"].startswith("skipped")
    assert summary["smollm2"]["torch_compile"]["skipped"]
    # every other contender either has a number or says why not
    for name in ("llamacpp", "torch_eager"):
        r = summary["smollm2"][name]
        assert r.get("decode_tok_s") or r.get("skipped"), (name, r)
    for name in ("luminal", "torch_eager", "onnxruntime"):
        r = summary["minilm"][name]
        assert r.get("b32_emb_s") or r.get("skipped") or r.get("b32_error"), (name, r)
    # a ratio is null exactly when its contender has no number
    llamacpp = summary["smollm2"]["llamacpp"]
    assert (summary["decode_vs_llamacpp"] is None) == (llamacpp.get("decode_tok_s") is None)
