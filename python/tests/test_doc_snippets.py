"""Every Python snippet of README.md, python/README.md and kernel-macros/README.md runs,
with the context it leaves out (a model, its inputs) given here, and what it claims in
its comments holds. (The Rust snippets are compiled by ``tests/outside_crate.rs``.)"""

import ast
import pathlib
import re
import sys

import pytest
import torch

import tessera

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python/examples"))
DOCS = ["README.md", "python/README.md", "kernel-macros/README.md"]


def python_snippets():
    """``(doc:line, text)`` of every fenced Python block of the docs."""
    snippets = []
    for doc in DOCS:
        lines = (REPO / doc).read_text().splitlines()
        start = None
        for i, line in enumerate(lines):
            if start is None and line.startswith("```python"):
                start = i + 1
            elif start is not None and line.startswith("```"):
                snippets.append((f"{doc}:{start}", "\n".join(lines[start:i]) + "\n"))
                start = None
    return snippets


def _llama_scope():
    from models import Llama, llama_inputs

    torch.manual_seed(0)
    return {"MyLlama": Llama, "ids": llama_inputs()[0]}


def _check_ops(scope, text):
    assert scope["o"].shape == (1, 8, 128, 64)
    assert scope["y"].shape == (4, 1000)
    torch.testing.assert_close(scope["y"].sum(-1), torch.ones(4))
    claimed = re.search(r"tessera\.explain\(.*# (\(.*\))", text).group(1)
    assert tessera.explain("softmax", rows=4, cols=1000) == ast.literal_eval(claimed)


def _check_graph_mode(scope, text):
    model, ids = scope["model"], scope["ids"]
    with torch.no_grad():
        torch.testing.assert_close(scope["logits"], model(ids), rtol=1e-4, atol=1e-4)
    # The default ("auto") took the kernels it measured as winners, and says so.
    stats = scope["stats"]
    (choice,) = stats["choices"].values()
    raced = {"+onednn_matmul", "+flash_attention", "+rms_norm", "+swiglu", "eager"}
    assert choice["how"] == "measured" and raced <= set(choice["ms"]), choice
    assert choice["compiler"] in ("inductor", "eager") and choice["inductor"] == {}, choice  # no convolution
    assert set(stats["kernels"]) == set(choice["kernels"]), stats
    # kernels="all" takes the kernels the comment lists.
    tessera.reset_graph_stats()
    with torch.no_grad():
        torch.testing.assert_close(scope["every"](ids), model(ids), rtol=1e-4, atol=1e-4)
    claimed = re.search(r"\"all\"}\)  # (\{[^}]*\})", text).group(1)
    assert tessera.graph_stats()["kernels"] == ast.literal_eval(claimed)


def _check_hf(scope, text):
    model = scope["model"]
    assert model.config._attn_implementation == "tessera"
    with tessera.trace_ops() as trace, torch.no_grad():
        model(torch.randint(0, 100, (2, 16)))
    assert trace.tessera["tessera.flash_attention.default"] == model.config.num_hidden_layers, trace


# A line that identifies each snippet -> (the names it uses but does not define, a check
# of what it made and claims).
CONTEXTS = {
    "o = torch.ops.tessera.flash_attention(q, k, v, is_causal=True)": (dict, _check_ops),
    'fast = torch.compile(model, backend="tessera")': (_llama_scope, _check_graph_mode),
    "tessera.hf.register()": (dict, _check_hf),
}


@pytest.mark.parametrize("place,text", python_snippets(), ids=lambda v: v if ":" in v else "")
def test_the_snippet_runs_and_its_claims_hold(place, text, monkeypatch, tmp_path):
    key = next((k for k in CONTEXTS if k in text), None)
    assert key is not None, f"{place}: a Python snippet with no context in {__file__}"
    make_scope, check = CONTEXTS[key]
    scope = make_scope()
    if check is _check_graph_mode:  # the snippet shows the default kernel choice
        monkeypatch.setenv("TESSERA_GRAPH_KERNELS", "auto")
        monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    # The graph-mode snippet shows graph_stats() as an expression: keep its value.
    runnable = text.replace("\ntessera.graph_stats()", "\nstats = tessera.graph_stats()")
    exec(compile(runnable, place, "exec"), scope)  # noqa: S102 - the docs' own snippet
    check(scope, text)


def test_every_snippet_has_a_context():
    keys = [next((k for k in CONTEXTS if k in text), None) for _, text in python_snippets()]
    assert None not in keys and sorted(keys) == sorted(CONTEXTS), keys
