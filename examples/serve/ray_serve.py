"""luminal serve replicas behind Ray Serve on this machine.

pip install "ray[serve]"
python examples/serve/ray_serve.py --replicas 2 --port 8000
# then: OpenAI clients at http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import time

import ray
from ray import serve

from luminal.serve.ray import application


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", help="GGUF file or model folder (default: SmolLM2)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    a = p.parse_args()
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": a.port})
    serve.run(
        application(
            num_replicas=a.replicas,
            num_cpus=a.cpus_per_replica,
            model=a.model,
            ctx=1024,
            max_seqs=16,
        ),
        route_prefix="/",
    )
    print(f"serving on http://127.0.0.1:{a.port}/v1 with {a.replicas} replicas (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
