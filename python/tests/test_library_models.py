"""Graph mode on the models people run: Hugging Face Transformers, timm and diffusers
models built from small configs with random weights (nothing is downloaded), each
through ``torch.compile(model, backend="tessera")`` in its default call, against eager
PyTorch (outputs, generated tokens, one training step's loss and gradients), with the
kernels each must take; Transformers' ``attn_implementation="tessera"``; and the
backend's promise never to raise on a graph it cannot take."""

import copy
import pathlib
import sys
import warnings

import pytest
import torch

import tessera
from tessera.graph import lower, patterns

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from helpers import fresh_graph_mode, on_compiler  # noqa: E402, F401 - autouse: Dynamo reset around each test
from models import library  # noqa: E402
from models.library import causal_lm  # noqa: E402

LAYERS = library.SIZES["test"][1]


# kernel -> calls per forward graph of a LAYERS-layer model on the Inductor path; the
# products: GPT-2's 4 per layer (qkv, attention out, MLP in and out), the others' 7 (q,
# k, v, o, gate, up, down), and the LM head
GPT2_PRODUCTS, GATED_PRODUCTS = 4 * LAYERS + 1, 7 * LAYERS + 1
DECODER_KERNELS = {
    "gpt2": {"flash_attention": LAYERS, "layer_norm": 2 * LAYERS + 1, "onednn_matmul": GPT2_PRODUCTS},
    "llama": {"flash_attention": LAYERS, "rms_norm": 2 * LAYERS + 1, "swiglu": LAYERS, "onednn_matmul": GATED_PRODUCTS},
    "qwen2": {"flash_attention": LAYERS, "rms_norm": 2 * LAYERS + 1, "swiglu": LAYERS, "onednn_matmul": GATED_PRODUCTS},
    "mistral": {
        "flash_attention": LAYERS,
        "rms_norm": 2 * LAYERS + 1,
        "swiglu": LAYERS,
        "onednn_matmul": GATED_PRODUCTS,
    },
    "gemma2": {"flash_attention": LAYERS, "rms_norm": 4 * LAYERS + 1, "onednn_matmul": GATED_PRODUCTS},
}
# BERT: q, k, v, attention out, MLP in and out per layer, and the pooler
BERT_KERNELS = {"flash_attention": LAYERS, "layer_norm": 2 * LAYERS + 1, "onednn_matmul": 6 * LAYERS + 1}


def ran_eagerly(stats):
    """The graphs (not patterns) graph mode ran eagerly."""
    return {k: v for k, v in stats["fallbacks"].items() if k.startswith(("g", "graph "))}


def ids(seq=16):
    return library.tokens()[:, :seq]


@pytest.mark.parametrize("name", sorted(DECODER_KERNELS))
def test_causal_lm_default_call_matches_eager_and_takes_the_kernels(name, both_compilers):
    model = causal_lm(name).eval()
    tokens = ids()
    with torch.no_grad():
        want = model(tokens).logits
        got = torch.compile(model, backend="tessera")(tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert ran_eagerly(stats) == {} and stats["graphs"] == 1, stats
    assert stats["kernels"] == on_compiler(DECODER_KERNELS[name], both_compilers), stats
    assert stats["fallbacks"] == {}, stats


def test_sliding_window_sets_the_kernels_window():
    # Mistral's sliding_window=8 keeps 8 keys per query: the kernel's window is 7.
    model = causal_lm("mistral").eval()
    code = []

    def capture(gm, example_inputs):
        patterns.substitute(gm, tessera.graph._constant_evaluator(gm, example_inputs))
        code.append(gm.code)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=capture)(ids())
    assert code[0].count("torch.ops.tessera.flash_attention(") == LAYERS, code[0]
    assert code[0].count("True, 0.25, 7)") == LAYERS, code[0]


def test_eager_attention_with_active_dropout_says_why_it_is_not_taken():
    model = causal_lm("gemma2").train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    found = tessera.explain_graph(model, ids())
    assert "flash_attention" not in found["substituted"], found
    assert found["kept"]["attention (eager form)"] == "attention dropout is active (p > 0 while training)", found


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_lm_training_step_matches_eager(name, both_compilers):
    model = causal_lm(name).train()
    model.config.use_cache = False
    twin = copy.deepcopy(model)
    tokens = ids()
    loss = torch.compile(model, backend="tessera")(tokens, labels=tokens).loss
    loss.backward()
    want = twin(tokens, labels=tokens).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    for (pname, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=pname)
    stats = tessera.graph_stats()
    assert stats["kernels"].get("flash_attention") == LAYERS, stats
    assert ran_eagerly(stats) == {} and stats["kernels"].get("flash_attention_bwd") == LAYERS, stats


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_padded_batch_matches_eager_and_takes_the_kernel_with_its_mask(name, both_compilers):
    # A padding mask depends on the input: flash attention takes it as its score mask
    # (rows that see no key give 0, as PyTorch's kernel does), with the sliding window
    # (Mistral) or soft-cap (Gemma 2) on top.
    model = causal_lm(name).eval()
    tokens, mask = ids(), torch.ones(2, 16, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        want = model(tokens, attention_mask=mask).logits
        got = torch.compile(model, backend="tessera")(tokens, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert ran_eagerly(stats) == {} and stats["fallbacks"] == {}, stats
    assert stats["kernels"]["flash_attention"] == LAYERS, stats


def test_padded_training_step_matches_eager(both_compilers):
    model = causal_lm("llama").train()
    twin = copy.deepcopy(model)
    tokens, mask = ids(), torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    loss = torch.compile(model, backend="tessera")(tokens, attention_mask=mask, labels=tokens).loss
    loss.backward()
    want = twin(tokens, attention_mask=mask, labels=tokens).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    for (pname, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=pname)
    stats = tessera.graph_stats()
    assert ran_eagerly(stats) == {} and stats["fallbacks"] == {}, stats
    assert stats["kernels"].get("flash_attention_bwd") == LAYERS, stats


def test_bert_with_padding_takes_attention_with_its_mask(both_compilers):
    model = library.bert().eval()
    tokens, mask = ids(), torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    with torch.no_grad():
        want = model(tokens, attention_mask=mask).last_hidden_state
        got = torch.compile(model, backend="tessera")(tokens, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert stats["kernels"] == on_compiler(BERT_KERNELS, both_compilers), stats
    assert stats["fallbacks"] == {}, stats


def test_bert_takes_attention_and_layer_norm():
    model = library.bert().eval()
    tokens = ids()
    with torch.no_grad():
        want = model(tokens).last_hidden_state
        got = torch.compile(model, backend="tessera")(tokens).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert stats["kernels"] == BERT_KERNELS, stats
    assert stats["fallbacks"] == {}, stats


VISION_KERNELS = {
    # qkv, attention out, MLP in and out per block, and the head
    "vit": {"flash_attention": LAYERS, "layer_norm": 2 * LAYERS + 1, "onednn_matmul": 4 * LAYERS + 1},
    "convnext": {"layer_norm": 9, "onednn_matmul": 1},  # channels-last LayerNorm; the head
    "resnet18": {"onednn_matmul": 1},  # the head
}


@pytest.mark.parametrize("name", sorted(VISION_KERNELS))
def test_timm_model_matches_eager_with_no_eager_graph(name, both_compilers):
    model, x = library.vision(name)
    model.eval()
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="tessera")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == {}, stats
    assert stats["kernels"] == on_compiler(VISION_KERNELS[name], both_compilers), stats


def test_diffusers_unet_matches_eager_with_no_eager_graph(both_compilers):
    unet, inputs = library.diffusion_unet()
    unet.eval()
    with torch.no_grad():
        want = unet(*inputs).sample
        got = torch.compile(unet, backend="tessera")(*inputs).sample
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = tessera.graph_stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == {}, stats
    # self- and cross-attention in each transformer block, its LayerNorms, the products of
    # its linear layers (attention projections, feed-forwards, time embedding)
    kernels = {"flash_attention": 8, "layer_norm": 12, "onednn_matmul": 50}
    assert stats["kernels"] == on_compiler(kernels, both_compilers), stats


# ---- never raise ------------------------------------------------------------------------


def test_a_graph_with_a_tensor_constant_compiles_forward_and_backward(xla_path):
    # Transformers' caches put tensor constants in every graph; copying them under
    # AOTAutograd's fake mode used to crash the backend.
    def f(x):
        return (x * torch.tensor([2.0, 3.0])).sin()

    x = torch.randn(4, 2, requires_grad=True)
    got = torch.compile(f, backend="tessera")(x)
    (gx,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, f(x))
    torch.testing.assert_close(gx, torch.autograd.grad(f(x).sum(), x)[0])
    stats = tessera.graph_stats()
    assert stats["graphs"] == 2 and stats["fallbacks"] == {}, stats


def test_an_unexpected_failure_runs_the_graph_eagerly_with_one_warning(monkeypatch):
    def broken(gm, constants, kernels):
        x = next(iter(gm.graph.nodes))
        with gm.graph.inserting_after(x):
            gm.graph.call_function(torch.neg, (x,))  # leaves the graph half-changed
        raise KeyError("a bug in a pass")

    monkeypatch.setattr(patterns, "substitute", broken)
    x = torch.randn(3, 5)
    with pytest.warns(UserWarning, match="runs eagerly: KeyError: 'a bug in a pass'"):
        got = torch.compile(lambda t: t.softmax(-1) * 2, backend="tessera")(x)
    torch.testing.assert_close(got, x.softmax(-1) * 2)
    monkeypatch.setenv("TESSERA_GRAPH_STRICT", "1")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="a bug in a pass"):
        torch.compile(lambda t: t.softmax(-1) * 3, backend="tessera")(x)


def test_a_failing_compiled_run_falls_back_to_eager(monkeypatch, xla_path):
    f = torch.compile(lambda t: t.cos() + 1, backend="tessera")
    x = torch.randn(6)
    torch.testing.assert_close(f(x), x.cos() + 1)

    def broken(inputs):
        raise RuntimeError("XLA: device lost")

    runners = [r for r in _runners()]
    assert runners, "no compiled runner found"
    for r in runners:
        r.run = broken
    with pytest.warns(UserWarning, match="running the compiled graph failed: RuntimeError: XLA: device lost"):
        torch.testing.assert_close(f(x), x.cos() + 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tessera")  # ours, not an import's
        torch.testing.assert_close(f(x), x.cos() + 1)  # eager from then on, no second warning


def _runners():
    import gc

    return [o for o in gc.get_objects() if type(o).__name__ == "_Runner"]


def test_a_tensor_constant_left_in_the_graph_is_imported_as_dense_elements():
    # Graph mode lifts tensor constants to inputs; one that stays reaches torch-mlir's
    # importer, whose default form (a dense_resource blob) XLA rejects.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return x * torch.tensor([2.0, 3.0]) + torch.tensor([[1, 2], [3, 4]]) + (x > 0)

    gm = make_fx(f)(torch.randn(2, 2))
    assert sum(n.op == "get_attr" for n in gm.graph.nodes) == 2
    text, _ = lower.to_stablehlo(gm)
    assert "dense_resource" not in text
    assert "dense<[2.000000e+00, 3.000000e+00]> : tensor<2xf32>" in text
    assert "dense<[[1, 2], [3, 4]]> : tensor<2x2xi64>" in text


def test_squeeze_dims_and_restriding_views_import():
    def f(x):
        return torch.squeeze(x.mean((-1, -2), keepdim=True), (2, 3)) * 2

    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    torch.testing.assert_close(torch.compile(f, backend="tessera")(x), f(x))
    assert tessera.graph_stats()["fallbacks"] == {}, tessera.graph_stats()


def test_a_failure_names_only_the_ops_that_failed(xla_path):
    def f(x):
        return torch.fft.rfft(torch.ops.tessera.softmax(x)).abs()

    with pytest.warns(UserWarning) as record:
        torch.compile(f, backend="tessera")(torch.randn(4, 8))
    message = " ".join(str(w.message) for w in record)
    assert "aten._fft_r2c" in message and "tessera.softmax" not in message, message


# ---- attn_implementation="tessera" ------------------------------------------------------


# A padded batch: Llama's causal padding runs varlen attention on the packed tokens;
# padding with a sliding window (Mistral) or soft-capping (Gemma 2) is flash attention's
# score mask.
PADDED = {"llama": "varlen", "mistral": "masked", "gemma2": "masked", "bert": "varlen"}


@pytest.mark.parametrize("name", sorted(PADDED))
def test_transformers_attention_implementation_runs_the_kernels(name):
    tessera.hf.register()
    model = (library.bert() if name == "bert" else causal_lm(name)).eval()
    tokens, mask = ids(), torch.ones(2, 16, dtype=torch.long)
    if name == "bert":
        mask[1, 11:] = 0  # right padding
    else:
        mask[1, :5] = 0  # left padding, as generate() pads
    out = (lambda o: o.last_hidden_state) if name == "bert" else (lambda o: o.logits)
    with torch.no_grad():
        want, want_padded = out(model(tokens)), out(model(tokens, attention_mask=mask))
        model.set_attn_implementation("tessera")
        with tessera.trace_ops() as trace:
            got = out(model(tokens))
        with tessera.trace_ops() as padded:
            got_padded = out(model(tokens, attention_mask=mask))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert trace.tessera["tessera.flash_attention.default"] == LAYERS, trace
    valid = mask.bool()  # what padding positions hold is the model's business
    torch.testing.assert_close(got_padded[valid], want_padded[valid], rtol=1e-4, atol=1e-4)
    kernel = "varlen_attention" if PADDED[name] == "varlen" else "flash_attention"
    assert padded.tessera[f"tessera.{kernel}.default"] == LAYERS and not padded.fallbacks, padded


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_gives_eagers_tokens_with_no_eager_graph(cache, xla_path):
    # The dynamic cache: Dynamo turns the growing length dynamic after the second step,
    # and each length then gets its own static graph (within TESSERA_GRAPH_SHAPES). The
    # static cache: its decode masks the cache by an input (cache_position), which the
    # kernel takes as its score mask.
    model = causal_lm("llama").eval()
    prompt = ids(seq=8)
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation=cache)
        model.forward = torch.compile(model.forward, backend="tessera")
        got = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation=cache)
    assert torch.equal(got, want)
    stats = tessera.graph_stats()
    assert ran_eagerly(stats) == {}, stats
    assert stats["fallbacks"] == {} and stats["kernels"]["flash_attention"] >= 2 * LAYERS, stats
    if cache == "dynamic":
        assert sum(stats["shapes"].values()) >= 2 and stats["kernels"]["flash_attention"] >= 4 * LAYERS, stats


def test_generate_on_the_inductor_path_compiles_the_dynamic_graph_once():
    # More new tokens than TESSERA_GRAPH_SHAPES: the growing length would run eagerly if
    # it were compiled per shape; Inductor takes the dynamic graph with its symbolic sizes.
    model = causal_lm("llama").eval()
    prompt = ids(seq=8)
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=12, do_sample=False)
        model.forward = torch.compile(model.forward, backend="tessera", options={"compiler": "inductor"})
        got = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want)
    stats = tessera.graph_stats()
    assert ran_eagerly(stats) == {} and stats["fallbacks"] == {}, stats
    assert list(stats["shapes"].values()) == ["dynamic"], stats
    assert stats["kernels"]["flash_attention"] >= 2 * LAYERS, stats


def test_explain_graph_agrees_with_graph_stats():
    model = causal_lm("mistral").eval()
    with torch.no_grad():
        found = tessera.explain_graph(model, ids())
        torch.compile(model, backend="tessera")(ids())
    # explain_graph lists the passes before AOTAutograd; oneDNN's products come after it.
    compiled = {k: n for k, n in tessera.graph_stats()["kernels"].items() if k != "onednn_matmul"}
    assert found["substituted"] == compiled, (found, tessera.graph_stats())
