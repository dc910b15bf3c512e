"""User op libraries (`tessera.load_library`): the example crate `python/examples/user_ops`
(fused residual-add + RMSNorm, bias + GELU(tanh)) built as a separate cdylib, its ops
checked against PyTorch on every backend, with opcheck, torch.compile, autograd through
a PyTorch formula, and bad libraries and arguments."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import python_frames_of, run_without_native_autograd

import tessera

REPO = pathlib.Path(__file__).resolve().parents[2]
CRATE = REPO / "python/examples/user_ops/Cargo.toml"
# Shared with tests/outside_crate.rs, which builds the same light facade.
TARGET = REPO / "target/outside-crate"


@pytest.fixture(scope="module")
def user_ops():
    """Builds the example library (a no-op when it is up to date) and loads it."""
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(CRATE), "--target-dir", str(TARGET)],
        check=True,
        cwd=REPO,
    )
    ops = tessera.load_library(TARGET / "release/libuser_ops.so")
    torch.library.register_autograd("user_ops::bias_gelu_tanh", _gelu_backward, setup_context=_gelu_setup)
    return ops


def _gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0] + inputs[1])


def _gelu_backward(ctx, grad):
    (h,) = ctx.saved_tensors
    with torch.enable_grad():
        h = h.detach().requires_grad_()
        (dh,) = torch.autograd.grad(F.gelu(h, approximate="tanh"), h, grad)
    return dh, dh.sum(0)


def close(got, want, dtype):
    tol = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 4e-2), torch.float16: (4e-3, 4e-3)}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1])


def add_rms_norm_ref(x, r, w, eps):
    h = (x.float() + r.float()).to(x.dtype)
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype), h


@pytest.mark.parametrize("backend", ["native", "interp", "xla"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 3), (37, 256), (8, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_match_pytorch(user_ops, backend, rows, cols, dtype):
    x, r = torch.randn(rows, cols, dtype=dtype), torch.randn(rows, cols, dtype=dtype)
    w, b = (torch.rand(cols) + 0.5).to(dtype), torch.randn(cols, dtype=dtype)
    with tessera.backend(backend):
        o, h = user_ops.add_rms_norm(x, r, w, eps=1e-5)
        g = user_ops.bias_gelu_tanh(x, b)
    want_o, want_h = add_rms_norm_ref(x, r, w, 1e-5)
    close(o, want_o, dtype)
    close(h, want_h, dtype)
    close(g, F.gelu((x.float() + b.float()).to(dtype).float(), approximate="tanh").to(dtype), dtype)


@pytest.mark.parametrize("backend", ["native", "interp", "xla"])
@pytest.mark.parametrize("rows,classes", [(1, 1), (7, 3), (37, 256), (30, 1000)])
def test_cross_entropy_and_exact_gelu_match_pytorch_with_int64_targets(user_ops, backend, rows, classes):
    logits, target = torch.randn(rows, classes) * 4, torch.randint(0, classes, (rows,))
    target[::3] = -100  # PyTorch's ignore_index: a loss of 0
    x, b, r = torch.randn(rows, classes), torch.randn(classes), torch.randn(rows, classes)
    with tessera.backend(backend):
        loss = user_ops.cross_entropy(logits, target)
        g = user_ops.bias_gelu_residual(x, b, r)
    close(loss, F.cross_entropy(logits, target, reduction="none"), torch.float32)
    close(g, F.gelu(x + b) + r, torch.float32)


@pytest.mark.parametrize("backend", ["native", "interp", "xla"])
def test_a_failed_check_is_pytorchs_error(user_ops, backend):
    # A target out of range fails the kernel's check_index! as PyTorch fails
    # F.cross_entropy: an IndexError (naming the first failing program and its block).
    logits = torch.randn(20, 5)
    for bad in (5, -1, -101):
        target = torch.zeros(20, dtype=torch.int64)
        target[11] = bad
        with pytest.raises(IndexError):
            F.cross_entropy(logits, target)
        with tessera.backend(backend), pytest.raises(IndexError) as e:
            user_ops.cross_entropy(logits, target)
        assert f"check failed: [program (1)] target out of bounds: i32[8] [0, 0, 0, {bad}, 0, 0, 0, 0]" in str(e.value)
    # Rows past the end of the ragged last block are padding, not checked; int64 values
    # int32 cannot hold are refused before the kernel runs.
    user_ops.cross_entropy(logits[:17], torch.zeros(17, dtype=torch.int64))
    with pytest.raises(IndexError, match="target: int64 value -4294967296 \\(element 2\\) is out of the int32"):
        user_ops.cross_entropy(logits, torch.tensor([0, 1, -(2**32)] + [0] * 17))


@pytest.mark.parametrize("backend", ["native", "interp", "xla"])
def test_an_empty_batch_gives_empty_results_without_a_launch(user_ops, backend):
    # The build functions answer zero rows with their output types (no kernel: a grid of
    # size 0 is not one); the results are PyTorch's, nothing runs.
    x, w, b = torch.randn(0, 8), torch.rand(8), torch.randn(8)
    with tessera.backend(backend), tessera.trace_ops() as trace:
        o, h = user_ops.add_rms_norm(x, x, w)
        g = user_ops.bias_gelu_residual(x, b, x)
        loss = user_ops.cross_entropy(torch.randn(0, 5), torch.zeros(0, dtype=torch.int64))
    assert trace.launches == [], trace.launches
    for got, want in [
        (o, x),
        (h, x),
        (g, F.gelu(x + b) + x),
        (loss, F.cross_entropy(torch.randn(0, 5), torch.zeros(0, dtype=torch.int64), reduction="none")),
    ]:
        assert got.shape == want.shape and got.dtype == want.dtype
    torch.library.opcheck(user_ops.add_rms_norm, (x, x, w, 1e-5))
    # The same call inside a compiled graph.
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b: user_ops.bias_gelu_residual(x, b, x) + 1, backend="tessera")
    assert compiled(x, b).shape == (0, 8)


def test_default_arguments_and_non_contiguous_inputs(user_ops):
    x = torch.randn(256, 9).t()  # [9, 256], not contiguous
    r, w = torch.randn(9, 256), torch.rand(256) + 0.5
    o, _ = user_ops.add_rms_norm(x, r, w)
    close(o, add_rms_norm_ref(x, r, w, 1e-6)[0], torch.float32)


def test_opcheck(user_ops):
    x, r = torch.randn(5, 33), torch.randn(5, 33)
    w, b = torch.rand(33) + 0.5, torch.randn(33)
    torch.library.opcheck(user_ops.add_rms_norm, (x, r, w, 1e-5))
    torch.library.opcheck(user_ops.bias_gelu_tanh, (x.requires_grad_(), b.requires_grad_()))
    torch.library.opcheck(user_ops.cross_entropy, (torch.randn(5, 33), torch.randint(0, 33, (5,))))


def test_autograd_through_a_pytorch_formula(user_ops):
    x, b = torch.randn(6, 40, requires_grad=True), torch.randn(40, requires_grad=True)
    user_ops.bias_gelu_tanh(x, b).square().sum().backward()
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    F.gelu(x2 + b2, approximate="tanh").square().sum().backward()
    close(x.grad, x2.grad, torch.float32)
    close(b.grad, b2.grad, torch.float32)


def test_torch_compile_fullgraph(user_ops):
    def f(x, r, w, b):
        o, h = user_ops.add_rms_norm(x, r, w, 1e-5)
        return user_ops.bias_gelu_tanh(o, b) + h

    x, r, w, b = torch.randn(12, 64), torch.randn(12, 64), torch.rand(64) + 0.5, torch.randn(64)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    close(compiled(x, r, w, b), f(x, r, w, b), torch.float32)


def test_loading_twice_gives_the_same_ops(user_ops):
    again = tessera.load_library(TARGET / "release/libuser_ops.so")
    assert again.add_rms_norm is user_ops.add_rms_norm


def test_calls_run_no_python_below_the_op(user_ops):
    # This build registers native CPU kernels for user ops, as for the library's.
    table = torch._C._dispatch_dump_table("user_ops::add_rms_norm")
    assert re.search(r"^CPU: registered at \S*torch_abi\.rs", table, re.M), table
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    assert python_frames_of(lambda: user_ops.add_rms_norm(x, r, w, 1e-5), "tessera") == []
    close(user_ops.add_rms_norm(x, r, w, 1e-5)[0], add_rms_norm_ref(x, r, w, 1e-5)[0], torch.float32)


def test_python_kernels_when_native_autograd_is_off(user_ops):
    # Without the native autograd kernels (which give native errors their Python type)
    # user ops keep Python CPU kernels: same results, same errors.
    script = (
        "import re, sys, torch, tessera\n"
        f"ops = tessera.load_library({str(TARGET / 'release/libuser_ops.so')!r})\n"
        "table = torch._C._dispatch_dump_table('user_ops::add_rms_norm')\n"
        "assert re.search(r'^CPU: registered at \\S*library\\.py', table, re.M), table\n"
        "x = torch.ones(2, 4)\n"
        "o, h = ops.add_rms_norm(x, x, torch.ones(4), 0.0)\n"
        "torch.testing.assert_close(o, torch.ones(2, 4))\n"
        "print('empty batch:', tuple(ops.bias_gelu_tanh(torch.zeros(0, 8), torch.ones(8)).shape))\n"
        "try:\n"
        "    ops.bias_gelu_tanh(torch.zeros(4, 8, dtype=torch.float64), torch.ones(8))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "for t in ([0, 3], [0, 2**40]):\n"
        "    try:\n"
        "        ops.cross_entropy(torch.zeros(2, 3), torch.tensor(t))\n"
        "    except IndexError as e:\n"
        "        print(e)\n"
    )
    out = run_without_native_autograd(script)
    assert "x: dtype torch.float64 is not supported" in out, out
    assert "empty batch: (0, 8)" in out, out
    assert "check failed: [program (0)] target out of bounds: i32[2] [0, 3]" in out, out
    assert "target: int64 value 1099511627776 (element 1) is out of the int32 range" in out, out


def test_bad_arguments_name_the_argument(user_ops):
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    with pytest.raises(ValueError, match="residual must be f32\\[4, 8\\], got f32\\[3, 8\\]"):
        user_ops.add_rms_norm(x, r[:3], w)
    with pytest.raises(ValueError, match="weight must be f32\\[8\\], got bf16\\[8\\]"):
        user_ops.add_rms_norm(x, r, w.bfloat16())
    with pytest.raises(ValueError, match="x: dtype torch.float64 is not supported"):
        user_ops.bias_gelu_tanh(torch.zeros(4, 8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="x must be a 2-D \\[rows, cols\\] tensor with cols > 0"):
        user_ops.bias_gelu_tanh(torch.randn(2, 4, 8), w)


def test_missing_and_foreign_libraries_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        tessera.load_library(tmp_path / "missing.so")
    not_a_library = tmp_path / "garbage.so"
    not_a_library.write_bytes(b"not an ELF file")
    with pytest.raises(ValueError, match="cannot load"):
        tessera.load_library(not_a_library)


def _c_library(tmp_path, name, manifest):
    """A shared library, compiled from C, that speaks the protocol with `manifest`."""
    cc = shutil.which("cc")
    assert cc, "a C compiler (cc) is needed; Rust's linker uses it"
    src = tmp_path / f"{name}.c"
    text = manifest.replace("\n", "\\n")
    src.write_text(
        "#include <stdlib.h>\n#include <string.h>\n"
        f'char *tessera_op_library_v1(void) {{ return strdup("{text}"); }}\n'
        'char *tessera_build_v1(const char *op, const char *req) { return strdup("error\\nunused"); }\n'
        "void tessera_free_v1(char *p) { free(p); }\n"
    )
    out = tmp_path / f"lib{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


REFUSED = [
    ("newer", "tessera-op-library 2\nir 1\nnamespace newer\n", "speaks op-library protocol 2.*rebuild the library"),
    (
        "bad_schema",
        "tessera-op-library 1\nir 1\nnamespace bad_schema\nop f(Tensor x -> Tensor\n",
        "op schema `f\\(Tensor x -> Tensor` is malformed",
    ),
    (
        "lists",
        "tessera-op-library 1\nir 1\nnamespace lists\nop g(Tensor[] xs) -> Tensor\n",
        "op `g` argument `xs` has type List\\[Tensor\\]",
    ),
    (
        "reserved",
        "tessera-op-library 1\nir 1\nnamespace tessera\nop x(Tensor x) -> Tensor\n",
        "namespace `tessera` is reserved",
    ),
    (
        "twin",
        "tessera-op-library 1\nir 1\nnamespace user_ops\nop y(Tensor x) -> Tensor\n",
        "namespace `user_ops` is already registered by .*libuser_ops.so",
    ),
]


@pytest.mark.parametrize("name,manifest,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_libraries_of_another_version_or_with_bad_schemas_are_refused(user_ops, tmp_path, name, manifest, message):
    with pytest.raises(ValueError, match=message):
        tessera.load_library(_c_library(tmp_path, name, manifest))


def test_a_failing_build_names_the_op(tmp_path):
    failing = _c_library(
        tmp_path, "failing", "tessera-op-library 1\nir 1\nnamespace failing\nop h(Tensor x) -> Tensor\n"
    )
    ops = tessera.load_library(failing)
    with pytest.raises(ValueError, match="op `h`: unused"):
        ops.h(torch.zeros(2))


def test_graph_mode_runs_user_ops_as_custom_calls(user_ops):
    def f(x, r, w, b):
        o, h = user_ops.add_rms_norm(x, r, w, 1e-5)
        return user_ops.bias_gelu_tanh(o, b) * 2 + h

    args = torch.randn(9, 48), torch.randn(9, 48), torch.rand(48) + 0.5, torch.randn(48)
    torch._dynamo.reset()
    tessera.reset_graph_stats()
    compiled = torch.compile(f, backend="tessera", fullgraph=True)
    close(compiled(*args), f(*args), torch.float32)
    stats = tessera.graph_stats()
    assert stats["fallbacks"] == {}
    assert stats["kernels"] == {"user_ops::add_rms_norm": 1, "user_ops::bias_gelu_tanh": 1}


def test_tpu_export_of_user_ops_compiles_for_a_device_free_v5e(user_ops, tmp_path):
    class Block(torch.nn.Module):
        def forward(self, x, r, w, b):
            o, h = user_ops.add_rms_norm(x, r, w, 1e-5)
            return user_ops.bias_gelu_tanh(o, b) + h

    path = tmp_path / "user_ops.tpu.mlir"
    args = torch.randn(16, 256), torch.randn(16, 256), torch.rand(256) + 0.5, torch.randn(256)
    text = tessera.export(Block(), *args, target="tpu", path=path)
    assert text.count("stablehlo.custom_call @tpu_custom_call") == 2
    checker = pathlib.Path(__file__).with_name("tpu_compile.py")
    r = subprocess.run([sys.executable, str(checker), str(path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "(2 Mosaic kernels) for v5e:2x2" in r.stdout, r.stdout + r.stderr[-2000:]
