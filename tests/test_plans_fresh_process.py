"""Every plan the op tests compiled, reloaded and run in a fresh process (runs after every other
test: ``after_all``, conftest.py)."""

import json
import os
import subprocess
import sys

import pytest

import optest

pytestmark = pytest.mark.after_all

CHECK = r"""
import json, sys
import numpy as np
import luminal.runtime as rt
bad = []
for plan, data, dims in json.load(sys.stdin):
    d = np.load(data)
    ins = {k[3:]: d[k] for k in d.files if k.startswith("in.")}
    outs = rt.load(plan).run(ins, **dims)
    for k in d.files:
        if k.startswith("out."):
            want, got = d[k], outs[k[4:]]
            if want.dtype.kind == "f":
                g64, w64 = got.astype(np.float64), want.astype(np.float64)
                ok = np.allclose(g64, w64, rtol=1e-3, atol=1e-3, equal_nan=True)
            else:
                ok = np.array_equal(got, want)
            if not ok:
                bad.append(f"{plan}: {k}")
print(json.dumps({"bad": bad}))
"""


def test_plans_reload_in_fresh_process():
    if not optest.MANIFEST:
        pytest.skip("no plans were compiled in this run (runtime not built or no op tests ran)")
    r = subprocess.run(
        [sys.executable, "-c", CHECK],
        input=json.dumps(optest.MANIFEST),
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])["bad"]
    assert not bad, f"{len(bad)} of {len(optest.MANIFEST)} plans differ after reload: {bad[:10]}"
