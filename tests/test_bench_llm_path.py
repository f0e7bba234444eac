"""bench/llm.py run as a script: its folder (holding kernels.py) must not shadow the `kernels`
package that transformers imports, or torch eager and ONNX Runtime are reported as not
installed."""

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")

# as `python bench/llm.py` starts: the script's folder first on the path, then its module code
_PROBE = f"""
import runpy, sys
sys.path.insert(0, {BENCH!r})
runpy.run_path({os.path.join(BENCH, "llm.py")!r}, run_name="probe")
import kernels, turns
print(kernels.__file__)
"""


def test_script_folder_does_not_shadow_the_kernels_package():
    outside = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; s = u.find_spec('kernels'); "
         "print(s.origin if s else '')"],
        capture_output=True, text=True, check=True, cwd=os.path.dirname(BENCH),
    ).stdout.strip()  # fmt: skip
    if not outside or os.path.dirname(outside) == BENCH:
        pytest.skip("no `kernels` package installed outside bench/")
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert os.path.dirname(p.stdout.strip()) != BENCH, p.stdout
