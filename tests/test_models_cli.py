"""The ``luminal`` command line on the default models (reference interpreter)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

from luminal.cli import main  # noqa: E402


def _have(fn) -> None:
    try:
        fn()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_embed_json(capsys) -> None:
    from luminal.models import minilm_dir

    _have(minilm_dir)
    assert main(["embed", "hello world", "a second sentence", "--json", "--backend", "interp"]) == 0
    out = capsys.readouterr()
    emb = np.asarray(json.loads(out.out.strip().splitlines()[-1]))
    assert emb.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert "backend interp" in out.err


def test_generate_streams_and_reports_speed(capsys) -> None:
    from luminal.models import smollm2_path

    _have(smollm2_path)
    argv = ["generate", "Paris is", "--no-chat", "-n", "3", "--backend", "interp", "--ctx", "16"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip()  # some text came out
    assert "prefill 2 tokens" in out.err and "tok/s" in out.err
    assert "reference interpreter" in out.err


def test_generate_prompt_longer_than_context(capsys) -> None:
    from luminal.models import smollm2_path

    _have(smollm2_path)
    argv = ["generate", "one two three four five six seven", "--no-chat", "--ctx", "4"]
    assert main(argv + ["--backend", "interp"]) == 2
    assert "context limit is 4" in capsys.readouterr().err


def test_missing_model_file_is_a_clear_error(capsys, tmp_path) -> None:
    missing = str(tmp_path / "nope.gguf")
    assert main(["generate", "hi", "--model", missing, "--backend", "interp"]) == 2
    assert "nope.gguf" in capsys.readouterr().err
