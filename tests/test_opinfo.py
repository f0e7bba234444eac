"""PyTorch's OpInfo database through torch.compile(backend="luminal").

Every op of ``op_db`` with float32 CPU samples is called compiled (one ``torch.compile`` per
sample, static shapes) and eagerly, and the results compared. Outcomes per sample:

- ``luminal``: all of it ran in luminal plans (a graph of views only, or no graph at all,
  counts too: nothing was left to compute);
- ``eager``: correct, but some of it ran in eager PyTorch (an op luminal does not convert);
- ``dynamo``: correct, but dynamo itself could not capture the call as one graph (data-dependent
  control flow, sparse tensors, random ops...): not the backend's to fix;
- ``wrong`` and ``crash``: failures. The tests assert there are none.

The default run checks a fixed sample of ops; ``-m slow`` a larger one; LUMINAL_TEST_OPINFO=all
every op with 3 samples (about an hour on two loaded cores). Each prints the fraction of ops
that ran fully in luminal. The measured search is off (budget 0): this is about coverage.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

import luminal.torch_backend as lt  # noqa: E402

try:
    from torch.testing._internal.common_methods_invocations import op_db
except Exception as e:  # noqa: BLE001 - a private module: any import failure means skip
    pytest.skip(f"OpInfo database unavailable: {e}", allow_module_level=True)

ALL = os.environ.get("LUMINAL_TEST_OPINFO", "") == "all"


@pytest.fixture(autouse=True)
def _no_search(monkeypatch):
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")
    yield
    torch._dynamo.reset()


def _name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _float_ops() -> list:
    out = []
    for op in op_db:
        try:
            if torch.float32 not in op.supported_dtypes("cpu"):
                continue
        except Exception:  # noqa: BLE001
            continue
        out.append(op)
    return sorted(out, key=_name)


OPS = _float_ops()
BY_NAME = {_name(op): op for op in OPS}

# A fixed sample for the default run (each sample compiles a plan: keep it short)
DEFAULT = ["tan", "atan2", "cummax", "var_mean", "ldexp", "diagonal", "topk",
           "scatter_reduce.amax", "special.airy_ai"]  # fmt: skip
EXTRA = ["lgamma", "addmv", "index_select", "nn.functional.pad.constant", "hypot", "acos",
         "trace", "linalg.diagonal", "diagonal_copy", "msort", "kthvalue", "nanmedian",
         "polygamma.polygamma_n_3", "special.zeta", "special.i1e", "special.ndtri",
         "special.log_ndtr", "index_reduce.prod", "unfold", "as_strided", "slice_scatter",
         "diagonal_scatter", "nn.functional.adaptive_max_pool2d", "nn.functional.grid_sample",
         "nn.functional.interpolate.bicubic", "nn.functional.batch_norm", "frexp", "nextafter",
         "searchsorted", "masked_scatter", "put", "logcumsumexp", "linalg.inv",
         "special.bessel_y1", "histc", "nn.functional.bilinear", "nonzero_static",
         "fft.fft2", "fft.irfft", "fft.hfft", "fft.ihfftn", "stft", "polar", "cfloat"]  # fmt: skip
# the slow run: every 16th op of the database and the default sample
SLOW = sorted(set(DEFAULT + EXTRA) | {_name(op) for op in OPS[::16]})


# results that differ run to run (random numbers, uninitialized memory): nothing to compare
_NONDETERMINISTIC = ("bernoulli", "cauchy", "empty", "exponential", "geometric", "log_normal",
                     "multinomial", "new_empty", "normal", "rand", "uniform",
                     "nn.functional.dropout", "nn.functional.alpha_dropout",
                     "nn.functional.feature_alpha_dropout", "nn.functional.fractional_max_pool",
                     "nn.functional.rrelu", "svd_lowrank", "pca_lowrank")  # fmt: skip


def _close(got, want) -> str | None:
    try:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, equal_nan=True,
                                   check_device=False)  # fmt: skip
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    except (TypeError, ValueError) as e:  # structure differs (e.g. tensor vs tuple)
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def run_sample(op, sample) -> tuple[str, str]:
    """(outcome, detail) of one sample; see the module docstring."""

    def fn(*a, **k):
        return op(*a, **k)

    args = (sample.input, *sample.args)
    try:
        want = fn(*args, **sample.kwargs)
    except Exception as e:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return "skip", f"eager raised {type(e).__name__}"
    torch._dynamo.reset()
    lt.reset_stats()
    dynamo_err = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                got = torch.compile(fn, backend="luminal", fullgraph=True)(*args, **sample.kwargs)
        except torch._dynamo.exc.Unsupported as e:
            dynamo_err = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            torch._dynamo.reset()
            try:
                with torch.no_grad():
                    got = torch.compile(fn, backend="luminal")(*args, **sample.kwargs)
            except Exception as e2:  # noqa: BLE001
                return "crash", f"{type(e2).__name__}: {str(e2)[:200]}"
        except Exception as e:  # noqa: BLE001
            if _dynamo_fails(fn, args, sample.kwargs):
                return "dynamo", f"dynamo itself: {type(e).__name__}: {str(e)[:120]}"
            return "crash", f"{type(e).__name__}: {str(e)[:200]}"
    bad = _close(got, want)
    if bad is not None:
        return "wrong", bad
    if dynamo_err is not None:
        return "dynamo", dynamo_err
    st = lt.stats
    if st.eager_ops or st.fallbacks or st.failed_plans:
        why = sorted(st.eager_ops) or st.fallbacks[:1]
        return "eager", "; ".join(why)[:300]
    return "luminal", ""


def _dynamo_fails(fn, args, kwargs) -> bool:
    """Whether dynamo with no backend at all fails the same call (a data-dependent check
    it cannot trace, say): then the failure is not the backend's."""
    torch._dynamo.reset()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(fn, backend="eager", fullgraph=True)(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return True
    finally:
        torch._dynamo.reset()
    return False


def run_ops(names: list[str], samples: int) -> dict[str, list[tuple[str, str]]]:
    out = {}
    for name in names:
        op = BY_NAME[name]
        if name.startswith(_NONDETERMINISTIC):
            continue
        try:
            ss = [s for _, s in zip(range(samples), op.sample_inputs("cpu", torch.float32))]
        except Exception as e:  # noqa: BLE001 - the database's own sample generator failed
            out[name] = [("skip", f"sample_inputs raised {type(e).__name__}")]
            continue
        out[name] = [run_sample(op, s) for s in ss] or [("skip", "no samples")]
    return out


def _report(res: dict[str, list[tuple[str, str]]]) -> tuple[list[str], list[str]]:
    counts = Counter()
    fails = []
    eager = []
    for name, rs in res.items():
        kinds = {k for k, _ in rs} - {"skip"}
        if not kinds:
            continue
        if kinds & {"wrong", "crash"}:
            counts["failed"] += 1
            fails += [f"{name}: {k} {d}" for k, d in rs if k in ("wrong", "crash")]
        elif kinds == {"luminal"}:
            counts["luminal"] += 1
        elif "eager" in kinds:
            counts["eager"] += 1
            eager.append(f"{name}: " + next(d for k, d in rs if k == "eager"))
        else:
            counts["dynamo"] += 1
    n = sum(counts.values())
    frac = counts["luminal"] / n if n else 0.0
    print(f"\nOpInfo: {n} ops, {counts['luminal']} ({frac:.0%}) fully in luminal, "
          f"{counts['eager']} partly eager, {counts['dynamo']} not captured by dynamo, "
          f"{counts['failed']} failed")  # fmt: skip
    for line in eager:
        print("  eager:", line)
    return fails, eager


def test_opinfo_default_sample():
    res = run_ops(DEFAULT, 1)
    fails, eager = _report(res)
    assert fails == []
    assert eager == [], "the default sample is chosen from ops luminal converts"


@pytest.mark.slow
def test_opinfo_wide_sample():
    names = [_name(op) for op in OPS] if ALL else SLOW
    fails, _ = _report(run_ops(names, 3 if ALL else 1))
    assert fails == []
