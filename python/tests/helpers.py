"""Helpers the test modules share."""

import os
import subprocess
import sys

import pytest
import torch

import tessera


@pytest.fixture(autouse=True)
def fresh_graph_mode():
    """Each test of a module that imports this starts and ends with Dynamo's caches
    empty, and starts with zeroed graph-mode stats."""
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    yield
    torch._dynamo.reset()


def on_compiler(kernels: dict, compiler: str) -> dict:
    """``graph_stats()["kernels"]`` expected on ``compiler`` from what the Inductor path
    takes: the XLA path does not take oneDNN's products (``onednn_matmul``)."""
    return kernels if compiler == "inductor" else {k: n for k, n in kernels.items() if k != "onednn_matmul"}


def python_frames_of(call, in_file):
    """The names of the Python functions defined in files whose path contains
    ``in_file`` that run during ``call()``."""
    seen = []

    def profile(frame, event, arg):
        if event == "call" and in_file in frame.f_code.co_filename:
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def run_without_native_autograd(script):
    """Runs ``script`` in a fresh interpreter with ``TESSERA_NATIVE_AUTOGRAD=0``; returns
    its standard output (asserting it succeeded)."""
    env = dict(os.environ, TESSERA_NATIVE_AUTOGRAD="0")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout
