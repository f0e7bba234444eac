import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path_factory, monkeypatch):
    """Each test gets an empty plan cache: a test that changes compiler internals must not be
    served a plan compiled by another test (tests of the cache set their own folder). It is
    removed after the test: a run's plans add up to about 100 MB."""
    if "LUMINAL_PLAN_CACHE_DIR" in os.environ:
        yield
        return
    folder = tmp_path_factory.mktemp("plans")
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(folder))
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fresh_dynamo(monkeypatch):
    """torch.compile tests: no search measuring (the plans, not their speed, are tested), and
    dynamo, luminal's backend counters and the seed reset around each test."""
    import torch

    import luminal.torch_backend as lt

    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")
    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``after_all`` summarize the run (ops covered, plans compiled): they run
    after every other test, whatever the file order."""
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)
