"""luminal serve behind Ray Serve: two replicas on loopback, both answering (slow tier:
starting Ray takes a while)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_serve import MODEL, free_port, make_tiny_llama  # noqa: E402


@pytest.mark.slow
def test_two_ray_serve_replicas(tmp_path) -> None:
    from ray import serve

    from luminal.serve.ray import application

    d = str(tmp_path / "tiny")
    make_tiny_llama(d)
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = application(
            num_replicas=2,
            num_cpus=0.5,
            model=d,
            model_name=MODEL,
            no_embed=True,
            ctx=96,
            max_seqs=2,
            max_tokens=16,
            quiet=True,
        )
        serve.run(app, route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        texts = {
            client.completions.create(
                model=MODEL, prompt="Hello there", max_tokens=6, temperature=0
            )
            .choices[0]
            .text
            for _ in range(4)
        }
        assert len(texts) == 1  # every replica gives the same greedy text
        pids = set()
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids.add(httpx.get(url + "/health").json()["pid"])
        assert len(pids) == 2, "requests did not reach both replicas"
        bad = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": 3})
        assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
    finally:
        serve.shutdown()
        ray.shutdown()
