"""Graph mode: ``torch.compile(model, backend="tessera")`` against eager PyTorch on the
model zoo (outputs, training losses and gradients), every attention/norm form the
substitution passes take (and the ones they must not), caching, fallbacks, dynamic
shapes, dumps and the debug log."""

import importlib.metadata
import math
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from tessera.graph import GraphModeError

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
from helpers import fresh_graph_mode  # noqa: E402, F401 - autouse: Dynamo reset around each test
from models import (  # noqa: E402
    ZOO,
    build,
    mingpt,  # noqa: E402
)
from models import llama as llama_mod  # noqa: E402


def compiled(model):
    return torch.compile(model, backend="tessera")


def test_backend_is_registered_and_declared_as_an_entry_point():
    assert "tessera" in torch._dynamo.list_backends()
    names = importlib.metadata.entry_points(group="torch_dynamo_backends").names
    assert "tessera" in names


# ---- the model zoo ----------------------------------------------------------------------

EXPECTED_KERNELS = {
    "mingpt": {"flash_attention", "layer_norm", "onednn_matmul"},
    "llama": {"flash_attention", "rms_norm", "swiglu", "onednn_matmul"},
    "resnet18": {"onednn_matmul"},
    "unet": set(),
    "dlrm": {"onednn_matmul"},
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_matches_eager(name):
    model, inputs = build(name)
    with torch.no_grad():
        want = model(*inputs)
        got = compiled(model)(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert stats["graphs"] == 1, stats
    assert stats["fallbacks"] == {}, stats
    assert set(stats["kernels"]) == EXPECTED_KERNELS[name], stats


def test_inductor_after_substitution_matches_eager_and_trains(monkeypatch):
    # options={"compiler": "inductor"}: Tessera's ops are Inductor's extern kernels.
    model, inputs = build("llama")
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="tessera", options={"compiler": "inductor"})(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert set(stats["kernels"]) == EXPECTED_KERNELS["llama"] and stats["fallbacks"] == {}, stats
    # TESSERA_GRAPH_COMPILER picks it too; a training step's gradients match eager's.
    torch._dynamo.reset()
    monkeypatch.setenv("TESSERA_GRAPH_COMPILER", "inductor")
    torch.manual_seed(0)
    ours, theirs = mingpt.GPT(), mingpt.GPT()
    theirs.load_state_dict(ours.state_dict())
    x, y = next(mingpt.batches())
    F.cross_entropy(compiled(ours)(x).flatten(0, 1), y.flatten()).backward()
    F.cross_entropy(theirs(x).flatten(0, 1), y.flatten()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_an_unknown_compiler_option_or_xla_client_is_an_error(monkeypatch):
    for options, message in (({"compiler": "tvm"}, "compiler 'tvm'"), ({"fast": True}, "unknown options")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(torch.sin, backend="tessera", options=options)(torch.randn(3))
    monkeypatch.setenv("TESSERA_XLA_CLIENT", "gpu")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="TESSERA_XLA_CLIENT='gpu': expected 'jaxlib' or 'plugin'"):
        torch.compile(torch.sin, backend="tessera", options={"compiler": "xla"})(torch.randn(3))


class _Block(nn.Module):
    """RMSNorm, causal attention and SwiGLU: three kernel families."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(32)

    def forward(self, x):
        h = self.norm(x)
        q = h.view(2, 8, 4, 8).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(2, 8, 32)
        return F.silu(a) * h


def test_the_kernels_option_chooses_what_is_substituted():
    block, x = _Block(), torch.randn(2, 8, 32)
    want = block(x)
    for kernels, taken in (
        ("all", {"rms_norm", "flash_attention", "swiglu"}),
        (["rms_norm"], {"rms_norm"}),
        ("swiglu,flash_attention", {"swiglu", "flash_attention"}),
        ("none", set()),
    ):
        torch._dynamo.reset()
        tessera.reset_graph_stats()
        got = torch.compile(block, backend="tessera", options={"kernels": kernels})(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert set(tessera.graph_stats()["kernels"]) == taken, kernels
    torch._dynamo.reset()
    with pytest.raises(Exception, match="kernels \\['gelu'\\]: expected 'auto', 'all', 'none' or some of"):
        torch.compile(block, backend="tessera", options={"kernels": ["gelu"]})(x)


def _auto(block, x):
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    got = torch.compile(block, backend="tessera", options={"kernels": "auto"})(x)
    torch.testing.assert_close(got, block(x), rtol=1e-5, atol=1e-5)
    stats = tessera.graph_stats()
    (choice,) = stats["choices"].values()
    return choice, stats["kernels"]


def test_auto_keeps_the_kernels_that_win_their_race_and_stores_the_choice(monkeypatch, tmp_path):
    from tessera.graph import choose

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    # Attention wins, RMSNorm ties (within the margin), SwiGLU wins over attention alone,
    # the two win the confirming race against no kernels, and compiled beats eager.
    races = iter([[1.0, 0.5], [0.5, 0.5], [0.5, 0.4], [1.0, 0.4], [0.4, 1.0]])
    monkeypatch.setattr(choose, "_race", lambda runs, inputs: next(races))
    block, x = _Block(), torch.randn(2, 8, 32)
    choice, kernels = _auto(block, x)
    assert choice == {
        "kernels": ["flash_attention", "swiglu"],
        "compiler": "inductor",
        "inductor": {},
        "training": True,
        "how": "measured",
        "ms": {
            "+flash_attention": [1.0, 0.5],
            "+rms_norm": [0.5, 0.5],
            "+swiglu": [0.5, 0.4],
            "confirm": [1.0, 0.4],
            "eager": [0.4, 1.0],
        },
    }, choice
    assert set(kernels) == {"flash_attention", "swiglu"}, kernels

    # A later compile (another process) reads the choice instead of racing again.
    monkeypatch.setattr(choose, "_race", lambda runs, inputs: pytest.fail("raced again"))
    choice, kernels = _auto(block, x)
    assert (choice["how"], choice["kernels"]) == ("stored", ["flash_attention", "swiglu"])
    assert set(kernels) == {"flash_attention", "swiglu"}, kernels

    # A corrupt entry is dropped with a warning naming it, and the graph is measured
    # again: this time attention's win is not confirmed, so nothing is taken, and the
    # graph runs eagerly, which wins its race against the compiled one.
    (entry,) = (tmp_path / "graph-choices").iterdir()
    entry.write_bytes(entry.read_bytes()[:-3])
    races = iter([[1.0, 0.5], [0.5, 0.6], [0.5, 0.6], [1.0, 0.99], [1.0, 0.9]])
    monkeypatch.setattr(choose, "_race", lambda runs, inputs: next(races))
    with pytest.warns(UserWarning, match="dropped .*graph-choices.*graph-"):
        choice, kernels = _auto(block, x)
    assert (choice["how"], choice["kernels"], choice["compiler"], kernels) == ("measured", [], "eager", {}), choice
    assert choice["ms"]["confirm"] == [1.0, 0.99]
    assert tessera.graph_stats()["inductor_cache"] == {"fx_graph_hits": 0, "fx_graph_misses": 0}  # not compiled


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean((2, 3))


def test_auto_compiles_without_inductors_layout_optimization_where_that_wins(monkeypatch, tmp_path):
    import torch._inductor.compile_fx as inductor

    from tessera.graph import choose

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # every graph really compiled
    # No kernel family; without the layout optimization is faster; compiled beats eager.
    races = iter([[1.0, 0.5], [0.5, 1.0]])
    monkeypatch.setattr(choose, "_race", lambda runs, inputs: next(races))
    settings = []
    inner = inductor.compile_fx_inner

    def spy(*args, **kwargs):
        settings.append(torch._inductor.config.layout_optimization)
        return inner(*args, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", spy)
    net, x = _ConvNet(), torch.randn(2, 3, 8, 8)
    choice, _ = _auto(net, x)
    assert choice["inductor"] == {"layout_optimization": False}, choice
    assert choice["ms"] == {"-layout_optimization": [1.0, 0.5], "eager": [0.5, 1.0]}, choice
    # A later compile reads the choice and compiles with it, forward and backward.
    settings.clear()
    torch._dynamo.reset()
    got = torch.compile(net, backend="tessera", options={"kernels": "auto"})(x)
    got.sum().backward()
    assert settings == [False, False], settings


def test_auto_times_a_training_graph_forward_and_backward(monkeypatch, tmp_path):
    from tessera.graph import choose

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    modes = []

    def race(runs, inputs):  # runs each candidate once, as the real race would
        modes.append(torch.is_grad_enabled())
        for run in runs:
            run(*inputs)
        return [1.0, 1.0]

    monkeypatch.setattr(choose, "_race", race)
    block, x = _Block(), torch.randn(2, 8, 32)
    choice, _ = _auto(block, x)  # the block's weights require gradients
    assert (choice["how"], choice["training"]) == ("measured", True), choice
    assert modes and all(modes), modes
    modes.clear()
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    with torch.no_grad():
        torch.compile(block, backend="tessera", options={"kernels": "auto"})(x)
    (choice,) = tessera.graph_stats()["choices"].values()
    assert (choice["how"], choice["training"]) == ("measured", False), choice  # stored apart
    assert modes and not any(modes), modes


def test_auto_measures_real_timings_and_takes_what_it_chose(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    choice, kernels = _auto(_Block(), torch.randn(2, 8, 32))
    assert choice["how"] == "measured", choice
    assert (
        {"+flash_attention", "+rms_norm", "+swiglu"}
        <= set(choice["ms"])
        <= {
            "+flash_attention",
            "+rms_norm",
            "+swiglu",
            "confirm",
            "eager",
        }
    )
    assert all(ms > 0 for pair in choice["ms"].values() for ms in pair), choice
    assert set(kernels) == set(choice["kernels"]), (kernels, choice)


def test_auto_measures_a_graph_that_writes_its_state_and_puts_the_state_back(monkeypatch, tmp_path):
    from tessera.graph import choose

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))

    def writes_its_input(x, cache):
        cache[:, :2].add_(1)
        return torch.softmax(x, -1)

    torch._dynamo.reset()
    x, cache = torch.randn(4, 16), torch.zeros(3, 4)
    got = torch.compile(writes_its_input, backend="tessera", options={"kernels": "auto"})(x, cache)
    torch.testing.assert_close(got, torch.softmax(x, -1))
    assert cache.sum().item() == 6.0  # as if written once: the races' writes were undone
    (choice,) = tessera.graph_stats()["choices"].values()
    assert choice["how"] == "measured", choice

    # Batch norm in training mode updates its running statistics with no in-place op
    # in the graph: they are put back too.
    torch._dynamo.reset()
    torch.manual_seed(0)
    bn, twin = nn.BatchNorm1d(16).train(), nn.BatchNorm1d(16).train()
    y = torch.randn(8, 16)
    torch.compile(bn, backend="tessera", options={"kernels": "auto"})(y)
    twin(y)
    torch.testing.assert_close(bn.running_mean, twin.running_mean)
    torch.testing.assert_close(bn.running_var, twin.running_var)
    assert bn.num_batches_tracked.item() == 1

    # Writing into its own intermediate values is no reason not to measure.
    def writes_its_own(x):
        h = x * 2
        h.add_(1)
        return torch.softmax(h, -1)

    races = iter([[1.0, 0.5], [1.0, 0.5], [0.5, 1.0]])  # softmax wins, confirmed; compiled wins
    monkeypatch.setattr(choose, "_race", lambda runs, inputs: next(races))
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    got = torch.compile(writes_its_own, backend="tessera", options={"kernels": "auto"})(x)
    torch.testing.assert_close(got, writes_its_own(x))
    (choice,) = tessera.graph_stats()["choices"].values()
    assert (choice["how"], choice["kernels"]) == ("measured", ["softmax"]), choice


def test_mingpt_trains_like_eager():
    torch.manual_seed(0)
    ours, theirs = mingpt.GPT(), mingpt.GPT()
    theirs.load_state_dict(ours.state_dict())
    forward = compiled(ours)
    x, y = next(mingpt.batches())
    F.cross_entropy(forward(x).flatten(0, 1), y.flatten()).backward()
    F.cross_entropy(theirs(x).flatten(0, 1), y.flatten()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    a = mingpt.train(ours, lambda x, y: F.cross_entropy(forward(x).flatten(0, 1), y.flatten()), steps=4)
    b = mingpt.train(theirs, steps=4)
    assert a[-1] < a[0]
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= 1e-4 * max(1.0, abs(y)), f"step {step}: tessera {x} vs eager {y}"
    stats = tessera.graph_stats()
    assert stats["kernels"].get("flash_attention_bwd", 0) >= 1 and "layer_norm" in stats["kernels"], stats
    assert stats["fallbacks"] == {}, stats


@pytest.fixture(params=["default", "xla-jaxlib", "xla-plugin"])
def runtime(request, monkeypatch):
    """The default compiler (Inductor), and the XLA path on each XLA client."""
    if request.param != "default":
        monkeypatch.setenv("TESSERA_GRAPH_COMPILER", "xla")
        monkeypatch.setenv("TESSERA_XLA_CLIENT", request.param.split("-")[1])


def test_llama_gradients_match_eager(runtime):
    model, (ids,) = build("llama")
    model.train()
    compiled(model)(ids).square().mean().backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(ids).square().mean().backward()
    for (name, p), g in zip(model.named_parameters(), ours):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    stats = tessera.graph_stats()
    assert stats["fallbacks"] == {} and stats["kernels"].get("flash_attention_bwd", 0) >= 1, stats


def test_llama_prefill_and_decode_match_eager():
    model, (ids,) = build("llama")
    want = llama_mod.generate(model, ids[:, :8], steps=3)
    # dynamic=False: one static graph per length (else Dynamo turns the growing length
    # dynamic after the first recompile, and graph mode runs that graph eagerly).
    got = llama_mod.generate(torch.compile(model, backend="tessera", dynamic=False), ids[:, :8], steps=3)
    assert torch.equal(got, want)
    assert tessera.graph_stats()["graphs"] == 3  # one graph per length (the last token needs none)


def test_windowed_softcapped_attention_in_graph_mode():
    # A Gemma-style call of the op itself: the custom call carries window and softcap, in
    # the forward and in the backward graph.
    def f(q, k, v):
        return torch.ops.tessera.flash_attention(q, k, v, True, None, 7, 20.0).sin().sum()

    q, k, v = (torch.randn(1, 4, 37, 16, requires_grad=True) for _ in range(3))
    got = torch.autograd.grad(compiled(f)(q, k, v), (q, k, v))
    want = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    kernels = tessera.graph_stats()["kernels"]
    assert "flash_attention" in kernels and "flash_attention_bwd" in kernels, kernels


def test_paged_attention_in_graph_mode():
    from test_ops import paged_inputs  # noqa: E402

    def decode(q, k_cache, v_cache, table, lens):
        return torch.ops.tessera.paged_attention(q, k_cache, v_cache, table, lens).tanh()

    args = paged_inputs()
    torch.testing.assert_close(compiled(decode)(*args), decode(*args))
    assert tessera.graph_stats()["kernels"] == {"paged_attention": 1}, tessera.graph_stats()


def test_varlen_attention_in_graph_mode_forward_and_backward():
    from test_ops import varlen_inputs  # noqa: E402

    def f(q, k, v, cu_q, cu_k):
        return torch.ops.tessera.varlen_attention(q, k, v, cu_q, cu_k, True).sin().sum()

    args = varlen_inputs([9, 1, 30], [12, 4, 30], grad=True)
    got = torch.autograd.grad(compiled(f)(*args), args[:3])
    want = torch.autograd.grad(f(*args), args[:3])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    kernels = tessera.graph_stats()["kernels"]
    assert "varlen_attention" in kernels and "varlen_attention_bwd" in kernels, kernels


def test_bf16_model_matches_eager():
    model, (ids,) = build("llama")
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        want = model(ids).float()
        got = compiled(model)(ids).float()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()
    assert "flash_attention" in tessera.graph_stats()["kernels"]


# ---- substitution patterns --------------------------------------------------------------


class Attention(nn.Module):
    """SDPA in one of the forms real models write it."""

    def __init__(self, form, heads=4, kv_heads=2, seq=16):
        super().__init__()
        self.form, self.n = form, heads // kv_heads
        self.register_buffer("tril", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))
        self.register_buffer("band", torch.ones(seq, seq, dtype=torch.bool).tril().triu(-2))
        i = torch.arange(seq)
        self.register_buffer("checker", (i[:, None] + i[None, :]) % 2 == 0)

    def forward(self, q, k, v):
        sq = q.shape[2]
        f = self.form
        if f == "is_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if f == "scale":
            return F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
        if f == "repeat_interleave":
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(self.n, dim=1), v.repeat_interleave(self.n, dim=1), is_causal=True
            )
        if f == "expand_reshape":
            b, h, s, d = k.shape
            k = k[:, :, None].expand(b, h, self.n, s, d).reshape(b, h * self.n, s, d)
            v = v[:, :, None].expand(b, h, self.n, s, d).reshape(b, h * self.n, s, d)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if f == "bool_mask_buffer":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.tril[:sq, :sq], enable_gqa=True)
        if f == "additive_mask":
            mask = torch.full((sq, sq), float("-inf")).triu(1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if f == "band_mask":  # causal with a sliding window of 2
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.band[:sq, :sq], enable_gqa=True)
        if f == "batch_band_mask":  # the same band, expanded over the batch as Transformers does
            mask = self.band[None, None, :sq, :sq].expand(q.shape[0], 1, sq, sq)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if f == "checker_mask":  # neither causal nor a window: the kernel's score mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.checker[:sq, :sq], enable_gqa=True)
        if f.startswith("written_"):  # attention written out, as Transformers' eager form
            k, v = k.repeat_interleave(self.n, dim=1), v.repeat_interleave(self.n, dim=1)
            s = q @ k.transpose(2, 3)
            if f == "written_scaled_div":
                s = s / math.sqrt(q.shape[-1])
            elif f == "written_softcap_causal":
                s = torch.tanh(s * 0.3 / 5.0) * 5.0
                s = s + torch.full((sq, sq), float("-inf")).triu(1)
            return F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        if f == "input_mask":  # depends on an input: the kernel's score mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=q[0, 0] @ k[0, 0].T > 0, enable_gqa=True)
        if f == "per_head_mask":  # one mask per head: must stay plain StableHLO
            return F.scaled_dot_product_attention(q, k, v, attn_mask=q[:1] @ q[:1].transpose(2, 3) > 0, enable_gqa=True)
        raise ValueError(f)


@pytest.mark.parametrize(
    "form",
    [
        "is_causal",
        "scale",
        "repeat_interleave",
        "expand_reshape",
        "bool_mask_buffer",
        "additive_mask",
        "band_mask",
        "batch_band_mask",
        "checker_mask",
        "input_mask",
        "per_head_mask",
        "written_unscaled",
        "written_scaled_div",
        "written_softcap_causal",
    ],
)
def test_attention_forms(form):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    model = Attention(form)
    with torch.no_grad():
        want = model(q, k, v)
        got = compiled(model)(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    stats = tessera.graph_stats()
    if form == "per_head_mask":
        assert "flash_attention" not in stats["kernels"], stats
        assert "has a mask per head" in stats["fallbacks"]["scaled_dot_product_attention"], stats
    else:
        products = {"onednn_matmul": 1} if form == "input_mask" else {}  # the mask's q @ k.T
        assert stats["kernels"] == {"flash_attention": 1, **products}, stats


class Norms(nn.Module):
    def __init__(self, form, dim=24):
        super().__init__()
        self.form, self.norm, self.w = form, nn.RMSNorm(dim, eps=1e-6), nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        if self.form == "module":
            return self.norm(x)
        if self.form == "functional":
            return F.rms_norm(x, (x.shape[-1],), self.w, 1e-6)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


@pytest.mark.parametrize("form", ["module", "functional", "hand_written"])
def test_rms_norm_forms(form):
    model, x = Norms(form), torch.randn(3, 5, 24)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-5, atol=1e-5)
    assert tessera.graph_stats()["kernels"] == {"rms_norm": 1}


def test_softmax_layer_norm_and_swiglu_are_substituted():
    ln = nn.LayerNorm(32)

    def f(x, g, u):
        return torch.softmax(ln(x), -1), F.silu(g) * u

    x, g, u = torch.randn(7, 32), torch.randn(5, 48), torch.randn(5, 48)
    with torch.no_grad():
        got, want = compiled(f)(x, g, u), f(x, g, u)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert tessera.graph_stats()["kernels"] == {"layer_norm": 1, "softmax": 1, "swiglu": 1}


def test_softmax_over_another_dim_is_not_substituted():
    x = torch.randn(6, 10)
    torch.testing.assert_close(compiled(lambda t: torch.softmax(t, 0))(x), torch.softmax(x, 0))
    stats = tessera.graph_stats()
    assert stats["kernels"] == {} and "not the last" in stats["fallbacks"]["softmax"]


def test_explain_graph_prints_what_would_be_substituted(capsys):
    model, inputs = build("llama")
    with torch.no_grad():
        found = tessera.explain_graph(model, *inputs)
    assert found["substituted"] == {"flash_attention": 2, "rms_norm": 5, "swiglu": 2}
    assert "substituted: flash_attention x2" in capsys.readouterr().out


# ---- caching, fallbacks, dynamic shapes, observability ----------------------------------


def test_recompiling_the_same_graph_hits_the_memory_cache(xla_path):
    model, inputs = build("resnet18")
    with torch.no_grad():
        compiled(model)(*inputs)
        first = tessera.graph_stats()["cache_hits"]["memory"]
        torch._dynamo.reset()
        compiled(model)(*inputs)
    stats = tessera.graph_stats()
    assert stats["graphs"] == 2 and stats["cache_hits"]["memory"] == first + 1, stats
    assert stats["fallbacks"] == {}, stats


def test_a_new_process_loads_the_executable_from_disk(tmp_path, xla_client):
    script = (
        f"import sys, torch, tessera; sys.path.insert(0, {str(EXAMPLES)!r})\n"
        "from models import build\n"
        "m, x = build('mingpt')\n"
        "with torch.no_grad(): torch.compile(m, backend='tessera')(*x)\n"
        "print(tessera.graph_stats()['cache_hits'])\n"
    )
    env = {**os.environ, "TESSERA_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[0].stdout.strip().endswith("{'memory': 0, 'disk': 0}"), runs[0].stdout
    assert runs[1].stdout.strip().endswith("{'memory': 0, 'disk': 1}"), runs[1].stdout


# Two graphs (two executables), one with a Tessera kernel inside.
SMALL_GRAPHS = (
    "import torch, tessera\n"
    "x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))\n"
    "for f in (lambda x: torch.softmax(x @ x.t(), -1) * 2 + 1, lambda x: torch.tanh(x).sum(0)):\n"
    "    torch.testing.assert_close(torch.compile(f, backend='tessera')(x), f(x))\n"
    "print(tessera.graph_stats()['cache_hits'], tessera.graph_stats()['fallbacks'])\n"
)


def run_small_graphs(cache_dir):
    env = {**os.environ, "TESSERA_CACHE_DIR": str(cache_dir)}
    r = subprocess.run([sys.executable, "-c", SMALL_GRAPHS], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_corrupt_cache_entries_are_recompiled_with_a_warning(tmp_path, xla_client):
    run_small_graphs(tmp_path)
    entries = list((tmp_path / xla_client).glob("*.bin"))
    assert len(entries) == 2, entries
    for e in entries:
        data = bytearray(e.read_bytes())
        data[len(data) // 2] ^= 0xFF
        e.write_bytes(bytes(data))
    r = run_small_graphs(tmp_path)
    assert r.stderr.count("checksum mismatch; recompiling") == len(entries), r.stderr
    assert r.stdout.strip().startswith("{'memory': 0, 'disk': 0} {}"), r.stdout
    # The recompiled entries replaced the corrupt ones.
    r = run_small_graphs(tmp_path)
    assert "warning" not in r.stderr and r.stdout.startswith("{'memory': 0, 'disk': 2}"), (r.stdout, r.stderr)


def test_an_unwritable_cache_dir_runs_from_memory_and_warns_once(tmp_path, xla_client):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache directory should be")
    r = run_small_graphs(blocker / "cache")
    assert r.stderr.count("warning: tessera cache: could not store") == 1, r.stderr
    assert r.stdout.strip().startswith("{'memory': 0, 'disk': 0} {}"), r.stdout


def test_jaxlibs_client_is_released_before_exit():
    # A client alive when C++'s static destructors run can abort the process; the
    # release must leave nothing holding it, and graphs still run (eagerly) after it.
    from tessera.graph import jaxlib_xla

    if jaxlib_xla.unavailable():
        pytest.skip(jaxlib_xla.unavailable())
    script = (
        "import gc, warnings, weakref, torch, tessera\n"
        "from tessera.graph import jaxlib_xla\n"
        "f = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend='tessera', options={'compiler': 'xla'})\n"
        "x = torch.randn(4, 5)\n"
        "torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)\n"
        "client = weakref.ref(jaxlib_xla._client)\n"
        "jaxlib_xla._release()\n"
        "gc.collect()\n"
        "print('client alive:', client() is not None)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)\n"
        "print([str(w.message) for w in caught])\n"
    )
    env = {**os.environ, "TESSERA_XLA_CLIENT": "jaxlib"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "client alive: False" in r.stdout and "released at exit" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_a_failing_kernel_inside_jaxlibs_program_is_an_error_naming_it():
    from tessera.graph import jaxlib_xla

    if jaxlib_xla.unavailable():
        pytest.skip(jaxlib_xla.unavailable())
    call = '{api_version = 4 : i32, backend_config = {op = "no_such_op", params = ""}}'
    text = (
        "module {\n  func.func @main(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {\n"
        f"    %a = stablehlo.custom_call @tessera_op(%x) {call} : (tensor<3x5xf32>) -> tensor<3x5xf32>\n"
        "    return %a : tensor<3x5xf32>\n  }\n}"
    )
    run, _, _ = jaxlib_xla.compile_module(text)
    with pytest.raises(Exception, match="@tessera_op: .*no_such_op"):
        run([torch.ones(3, 5)])
    # The client still runs programs after the failure.
    run, _, _ = jaxlib_xla.compile_module(text.replace("no_such_op", "softmax").replace('""', '"rows=3,cols=5"'))
    torch.testing.assert_close(run([torch.ones(3, 5)])[0], torch.full((3, 5), 0.2))


def unsupported(x):
    return torch.fft.rfft(x).abs() + 1


def test_an_op_torch_mlir_cannot_lower_runs_eagerly_with_a_warning(xla_path):
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match=r"runs eagerly: torch-mlir cannot lower aten._fft_r2c"):
        got = compiled(unsupported)(x)
    torch.testing.assert_close(got, unsupported(x))
    assert list(tessera.graph_stats()["fallbacks"].values()) == ["torch-mlir cannot lower aten._fft_r2c to StableHLO"]


def test_strict_mode_makes_a_fallback_an_error(monkeypatch, xla_path):
    monkeypatch.setenv("TESSERA_GRAPH_STRICT", "1")
    with pytest.raises(Exception, match="aten._fft_r2c") as info:
        compiled(unsupported)(torch.randn(4, 8))
    assert GraphModeError.__name__ in str(info.value)  # Dynamo wraps backend errors


def test_dynamic_shapes_compile_each_shape_up_to_a_bound(monkeypatch, xla_path):
    monkeypatch.setenv("TESSERA_GRAPH_SHAPES", "2")

    def f(x):
        return torch.relu(x).softmax(-1) * 2

    g = torch.compile(f, backend="tessera", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tessera")  # ours, not an import's
        for n in (3, 5, 3, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(g(x), f(x))
    stats = tessera.graph_stats()
    assert list(stats["shapes"].values()) == [2] and stats["kernels"] == {"softmax": 2}, stats
    assert stats["fallbacks"] == {}, stats
    x = torch.randn(9, 4)
    with pytest.warns(UserWarning, match="more than 2 shapes"):
        torch.testing.assert_close(g(x), f(x))


def test_dynamic_shapes_train_like_eager():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    g = torch.compile(model, backend="tessera", dynamic=True)
    for n in (3, 6):
        x = torch.randn(n, 8)
        g(x).square().sum().backward()
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for a, p in zip(ours, model.parameters()):
            torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-5)
        model.zero_grad()
    stats = tessera.graph_stats()
    assert stats["kernels"].get("layer_norm") == 2 and stats["fallbacks"] == {}, stats


def test_dump_and_debug_log(tmp_path, monkeypatch, capfd, xla_path):
    monkeypatch.setenv("TESSERA_DUMP", str(tmp_path))
    monkeypatch.setenv("TESSERA_LOG", "debug")
    model, inputs = build("llama")
    with torch.no_grad():
        compiled(model)(*inputs)
    names = sorted(p.name for p in tmp_path.iterdir())
    for suffix in ("fx_before.py", "fx_after.py", "forward.stablehlo.mlir", "forward.summary.txt"):
        assert any(n.endswith(suffix) for n in names), names
    text = next(p for p in tmp_path.iterdir() if p.name.endswith(".stablehlo.mlir")).read_text()
    assert text.count("@tessera_op") == 9  # 2 attention + 5 norms + 2 swiglu
    assert "Tessera kernels (flash_attention, rms_norm, swiglu)" in capfd.readouterr().err


def test_int64_bool_empty_and_multiple_outputs_cross_the_boundary(runtime):
    def f(ids, flags, x, empty):
        return ids * 2 + 1, flags & (x > 0), x.sum(0), empty + 1, empty.sum() + x.sum()

    args = (torch.arange(12).reshape(3, 4), torch.rand(3, 4) > 0.5, torch.randn(3, 4), torch.empty(0, 4))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tessera")  # ours, not an import's
        got = compiled(f)(*args)
    for a, b in zip(got, f(*args)):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    assert tessera.graph_stats()["fallbacks"] == {}, tessera.graph_stats()


# ---- TPU export -------------------------------------------------------------------------


# DLRM has no Tessera kernel, but tensor constants torch-mlir leaves as arith.constant,
# which libtpu refuses ("unstable op"): the export makes them stablehlo.constant.
@pytest.mark.parametrize("name,kernels", [("llama", 9), ("mingpt", 7), ("dlrm", 0)])
def test_tpu_export_compiles_for_a_device_free_v5e(name, kernels, tmp_path):
    model, inputs = build(name)
    path = tmp_path / f"{name}.tpu.mlir"
    text = tessera.export(model, *inputs, target="tpu", path=path)
    assert text.count("stablehlo.custom_call @tpu_custom_call") == kernels
    assert "tessera_op" not in text and "dense_resource" not in text and "arith.constant" not in text
    checker = pathlib.Path(__file__).with_name("tpu_compile.py")
    r = subprocess.run([sys.executable, str(checker), str(path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"({kernels} Mosaic kernels) for v5e:2x2" in r.stdout, r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("mesh", [2, 4])
def test_sharded_tpu_export_compiles_for_a_partitioned_v5e(mesh, tmp_path):
    # Llama (8 query / 2 kv heads): over 2 devices every kernel splits, attention over its
    # heads; over 4 the kv heads do not divide, so attention runs whole and only the
    # row-wise kernels split. Each split kernel sits in a manual-sharding region built
    # for its local shapes; libtpu partitions the module over `mesh` devices of v5e:2x2.
    model, inputs = build("llama")
    path = tmp_path / f"llama.mesh{mesh}.tpu.mlir"
    text = tessera.export(model, *inputs, target="tpu", path=path, mesh=mesh)
    assert f"mhlo.num_partitions = {mesh} : i32" in text and f'sdy.mesh @mesh = <["model"={mesh}]>' in text
    assert text.count("stablehlo.custom_call @tpu_custom_call") == 9
    regions = text.count("sdy.manual_computation")
    assert regions == (9 if mesh == 2 else 9 - 2), regions  # the 2 attention calls stay whole
    checker = pathlib.Path(__file__).with_name("tpu_compile.py")
    r = subprocess.run([sys.executable, str(checker), str(path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"partitioned over {mesh} devices" in r.stdout, r.stdout + r.stderr[-2000:]


def test_sharded_export_arguments_are_checked():
    model, inputs = build("llama")
    with pytest.raises(ValueError, match="mesh must be a device count"):
        tessera.export(model, *inputs, target="cpu", mesh=2)
    with pytest.raises(ValueError, match="mesh must be a device count"):
        tessera.export(model, *inputs, target="tpu", mesh=0)


def test_tpu_export_names_the_kernel_the_tpu_rules_reject():
    class Half(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    with pytest.raises(GraphModeError, match="TPU: .*softmax"):
        tessera.export(Half(), torch.randn(8, 128, dtype=torch.float16), target="tpu")


def test_tpu_export_refuses_varlen_attention_whose_tiles_are_planned_on_the_host():
    from test_ops import varlen_inputs  # noqa: E402

    class Packed(nn.Module):
        def forward(self, q, k, v, cu_q, cu_k):
            return torch.ops.tessera.varlen_attention(q, k, v, cu_q, cu_k, True)

    with pytest.raises(GraphModeError, match="TPU: varlen_attention's kernel takes 6 inputs"):
        tessera.export(Packed(), *varlen_inputs([5, 9]), target="tpu")
    assert "tessera_op" in tessera.export(Packed(), *varlen_inputs([5, 9]), target="cpu")


def test_cpu_export_is_the_module_graph_mode_runs():
    model, inputs = build("llama")
    text = tessera.export(model, *inputs, target="cpu")
    assert text.count("@tessera_op") == 9


def test_export_command_line(tmp_path):
    def export(model, *args):
        command = [sys.executable, "-m", "tessera", "export", model, "--path", str(EXAMPLES), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    out = tmp_path / "llama.mlir"
    r = export("models:llama_for_export", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote" in r.stderr and out.read_text().count("@tpu_custom_call") == 9
    r = export("models:llama_for_export", "--out", str(out), "--mesh", "2")
    assert r.returncode == 0 and out.read_text().count("sdy.manual_computation") == 9, r.stderr[-2000:]
    r = export("models:llama_for_export", "--target", "cpu", "--mesh", "2")
    assert r.returncode == 1 and "mesh must be a device count" in r.stderr, r.stderr[-2000:]
    r = export("models:nope")
    assert r.returncode == 2 and "cannot load models:nope" in r.stderr


def test_graph_mode_and_eager_attention_look_up_the_same_tuned_blocks(xla_path):
    # The XLA path writes the kernel's parameters itself: with the scale left to the
    # kernel (None) they name the same problem as the eager op, so both find the blocks
    # `tessera tune` stored for it.
    q, k, v = torch.randn(1, 4, 40, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sin()

    def problems(f):
        with torch.no_grad():
            f(q, k, v)  # compiled outside the launch trace
            was_on = tessera._tessera.trace_launches(True)
            tessera._tessera.take_launches()
            try:
                f(q, k, v)
            finally:
                tessera._tessera.trace_launches(was_on)
        launches = [launch.split(" ", 1) for launch in tessera._tessera.take_launches()]
        launches = [(kernel, params) for kernel, params in launches if kernel == "flash_attention"]
        assert launches
        return {tessera._tessera.tuning_problem(kernel, params.split(",")) for kernel, params in launches}

    eager = problems(lambda q, k, v: torch.ops.tessera.flash_attention(q, k, v, is_causal=True)[0].sin())
    graph = problems(compiled(attend))
    assert graph == eager and "scale=none" in next(iter(eager)), (graph, eager)
