"""Fixtures every test module may take by name."""

import os

import pytest

# The tests check which kernels graph mode substitutes, so they take every kernel rather
# than the default "auto" (what this machine's timings favour); the tests of "auto" ask
# for it. Processes the tests start inherit it.
os.environ["TESSERA_GRAPH_KERNELS"] = "all"


@pytest.fixture
def xla_path(monkeypatch):
    """Graph mode compiles on the XLA path (the default is Inductor), in this process and
    the ones a test starts."""
    monkeypatch.setenv("TESSERA_GRAPH_COMPILER", "xla")


@pytest.fixture(params=["inductor", "xla"])
def both_compilers(request, monkeypatch):
    """Runs a test on each compiler graph mode hands the substituted graph to."""
    monkeypatch.setenv("TESSERA_GRAPH_COMPILER", request.param)
    return request.param


@pytest.fixture(params=["jaxlib", "plugin"])
def xla_client(request, monkeypatch):
    """Runs a test on the XLA path on each XLA client (jaxlib's in-process client, the
    PJRT plugin); returns the client's cache directory under the cache dir."""
    monkeypatch.setenv("TESSERA_GRAPH_COMPILER", "xla")
    monkeypatch.setenv("TESSERA_XLA_CLIENT", request.param)
    return {"jaxlib": "xla-jaxlib", "plugin": "xla"}[request.param]
