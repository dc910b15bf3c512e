"""The one table of ``TESSERA_*`` variables (``runtime::config``, read by
``tessera.config``): every variable the code or tests read is declared there, values
set at run time apply, and ``python -m tessera config`` lists them."""

import pathlib
import re
import subprocess
import sys

import pytest

import tessera

REPO = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ["kernel-ir", "lowering", "runtime", "kernels", "src", "aten-bindings", "benches", "tests", "python"]
# Not settings: a test's protocol with the child process it starts, build-time inputs,
# and the outside crate's manifest placeholder.
NOT_SETTINGS = {
    "TESSERA_PRINT_CHILD",
    "TESSERA_TEST_CACHE_DIR",
    "TESSERA_PJRT_HEADER",
    "TESSERA_DEFAULT_PJRT_PLUGIN",
    "TESSERA_PATH",
}


def test_every_variable_the_code_reads_is_declared_once():
    used = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".rs", ".py", ".cc") and "target" not in path.parts and path.name != "test_config.py":
                used |= set(re.findall(r"\bTESSERA_[A-Z0-9_]+", path.read_text(errors="ignore")))
    used |= set(re.findall(r"\bTESSERA_[A-Z0-9_]+", (REPO / "Makefile").read_text()))
    undeclared = used - set(tessera.config.VARIABLES) - NOT_SETTINGS
    assert not undeclared, f"declare these in runtime/src/config.rs: {sorted(undeclared)}"
    assert all(doc for _, doc in tessera.config.VARIABLES.values())


def test_values_set_at_run_time_apply(monkeypatch):
    monkeypatch.setenv("TESSERA_GRAPH_SHAPES", "3")
    assert tessera.config.get("TESSERA_GRAPH_SHAPES", "8") == "3"
    monkeypatch.setenv("TESSERA_GRAPH_SHAPES", "")
    assert tessera.config.get("TESSERA_GRAPH_SHAPES", "8") == "8"
    with pytest.raises(KeyError, match="TESSERA_NOPE is not a Tessera variable"):
        tessera.config.get("TESSERA_NOPE")


def test_python_m_tessera_config_lists_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "tessera", "config"],
        capture_output=True,
        text=True,
        check=True,
        env={"TESSERA_BACKEND": "interp", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "TESSERA_BACKEND=interp [default: auto]" in out
    assert all(f"{name}=" in out for name in tessera.config.VARIABLES)
