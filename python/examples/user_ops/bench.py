"""Times the example library's cross-entropy and bias + exact GELU + residual ops against
PyTorch, interleaved, at the sizes kernel authors ask about (N=4096, V=32000; H=4096).

    cargo build --release --manifest-path python/examples/user_ops/Cargo.toml \\
        --target-dir target/outside-crate
    .venv/bin/python python/examples/user_ops/bench.py [--runs 15] [--rounds 2]
"""

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "models"))
from bench import median_ms  # noqa: E402 - the model bench's timer

import tessera  # noqa: E402

LIBRARY = pathlib.Path(__file__).resolve().parents[3] / "target/outside-crate/release/libuser_ops.so"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ops = tessera.load_library(LIBRARY)
    n, v, h = 4096, 32000, 4096
    logits, target = torch.randn(n, v), torch.randint(0, v, (n,))
    x, b, r = torch.randn(n, h), torch.randn(h), torch.randn(n, h)
    cases = {
        f"cross_entropy {n}x{v} (int64 targets)": (
            lambda: ops.cross_entropy(logits, target),
            lambda: F.cross_entropy(logits, target, reduction="none"),
            logits.nbytes,
        ),
        f"bias_gelu_residual {n}x{h}": (
            lambda: ops.bias_gelu_residual(x, b, r),
            lambda: F.gelu(x + b) + r,
            4 * x.nbytes,
        ),
    }
    print(f"{'op':42} {'tessera ms':>11} {'torch ms':>9} {'ratio':>6} {'GB/s':>6}")
    for _ in range(args.rounds):
        for name, (ours, theirs, nbytes) in cases.items():
            a, p = median_ms(ours, args.runs), median_ms(theirs, args.runs)
            print(f"{name:42} {a:11.1f} {p:9.1f} {a / p:6.2f} {nbytes / a / 1e6:6.1f}")


if __name__ == "__main__":
    main()
