"""Eager per-call cost of Tessera's torch ops against PyTorch's, in one process.

    .venv/bin/python python/benches/eager_cost.py [--repeats 15]

Each row times the Tessera op and the PyTorch computation a user would write instead,
on the same inputs, alternating, and prints medians (of `--repeats` timings, each the
mean of enough calls to take ~20 ms) and their ratio (< 1: Tessera is faster). torch
keeps its own 2 threads; Tessera's native backend uses both cores (small kernels run on
the calling thread). The inference_mode row shows the dispatcher path alone: there
PyTorch skips autograd kernels (Tessera's are C++ for calls that need no gradient,
Python for those that do; TESSERA_NATIVE_AUTOGRAD=0 keeps them all Python).
"""

import argparse
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F

import tessera

ops = torch.ops.tessera
# The example op library (python/examples/user_ops), as python/tests/test_user_ops.py
# builds it; its row is left out when it is not built.
USER_OPS = pathlib.Path(__file__).resolve().parents[2] / "target/outside-crate/release/libuser_ops.so"


def per_call(fn, budget=0.02):
    """Mean seconds per call of ``fn`` over a batch that takes about ``budget``."""
    fn()
    n, start = 1, time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    n = max(1, int(budget / once))
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def compare(repeats, tessera_fn, torch_fn):
    a, b = [], []
    for _ in range(repeats):
        a.append(per_call(tessera_fn))
        b.append(per_call(torch_fn))
    return statistics.median(a), statistics.median(b)


def attention_inputs(grad=False):
    q = torch.randn(1, 8, 256, 64, requires_grad=grad)
    k = torch.randn(1, 2, 256, 64, requires_grad=grad)
    v = torch.randn(1, 2, 256, 64, requires_grad=grad)
    return q, k, v


def fwd_bwd(fn, leaves, grad):
    """A call of ``fn`` then its backward for output gradient ``grad``, the gradients
    of ``leaves`` cleared first."""

    def run():
        for t in leaves:
            t.grad = None
        fn().backward(grad)

    return run


def rows():
    x64, w256 = torch.randn(64, 256), torch.rand(256) + 0.5
    x512 = torch.randn(512, 2048)
    g, u = torch.randn(256, 4096), torch.randn(256, 4096)
    q, k, v = attention_inputs()
    qg, kg, vg = attention_inputs(grad=True)
    do = torch.randn(1, 8, 256, 64)

    x1 = torch.randn(1, 8)
    yield "softmax 1x8 (a call's fixed cost)", lambda: ops.softmax(x1), lambda: torch.softmax(x1, -1)
    # The same through torch.ops, the dispatcher path every custom op takes (torch.softmax
    # is a direct C++ binding).
    yield ("same vs torch.ops.aten._softmax", lambda: ops.softmax(x1), lambda: torch.ops.aten._softmax(x1, -1, False))
    yield "softmax 64x256", lambda: ops.softmax(x64), lambda: torch.softmax(x64, -1)

    def inference(fn):
        def run():
            with torch.inference_mode():
                return fn()

        return run

    yield ("same, under inference_mode", inference(lambda: ops.softmax(x64)), inference(lambda: torch.softmax(x64, -1)))
    yield ("rms_norm 64x256", lambda: ops.rms_norm(x64, w256, 1e-5), lambda: F.rms_norm(x64, (256,), w256, 1e-5))
    if USER_OPS.exists():
        user = tessera.load_library(USER_OPS)
        r64 = torch.randn(64, 256)
        yield (
            "user op add_rms_norm 64x256 (example crate)",
            lambda: user.add_rms_norm(x64, r64, w256, 1e-5),
            lambda: (F.rms_norm(x64 + r64, (256,), w256, 1e-5), x64 + r64),
        )
    yield "softmax 512x2048", lambda: ops.softmax(x512), lambda: torch.softmax(x512, -1)
    yield "swiglu 256x4096", lambda: ops.swiglu(g, u), lambda: F.silu(g) * u
    yield (
        "flash_attention GQA 8/2, S256, D64, causal",
        lambda: ops.flash_attention(q, k, v, is_causal=True),
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    )
    yield (
        "same, forward + backward",
        fwd_bwd(lambda: ops.flash_attention(qg, kg, vg, is_causal=True), (qg, kg, vg), do),
        fwd_bwd(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True), (qg, kg, vg), do),
    )
    # bf16 tensors: the native kernels read and write their 2-byte storage in place.
    xb = x512.bfloat16()
    yield "softmax 512x2048, bf16", lambda: ops.softmax(xb), lambda: torch.softmax(xb, -1)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    yield (
        "flash_attention as above, bf16",
        lambda: ops.flash_attention(qb, kb, vb, is_causal=True),
        lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True),
    )


def print_table(doc, rows, repeats=15, width=44):
    """Parses ``--repeats`` (default ``repeats``), times ``rows`` (name, tessera, torch)
    and prints the markdown table."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=repeats)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.repeats}")
    print(f"| {'call':<{width}} | {'tessera':>10} | {'PyTorch':>10} | {'ratio':>5} |")
    print(f"|{'-' * (width + 2)}|{'-' * 12}|{'-' * 12}|{'-' * 7}|")
    for name, tessera_fn, torch_fn in rows:
        t, p = compare(args.repeats, tessera_fn, torch_fn)
        unit, scale = ("us", 1e6) if max(t, p) < 1e-3 else ("ms", 1e3)
        print(f"| {name:<{width}} | {t * scale:>7.1f} {unit} | {p * scale:>7.1f} {unit} | {t / p:>5.2f} |")


def main():
    print_table(__doc__, rows())
    print(f"(backend: {tessera.explain('softmax', rows=64, cols=256)[0]})")


if __name__ == "__main__":
    main()
