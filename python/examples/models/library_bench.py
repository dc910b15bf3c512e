"""Graph-mode benchmark (not a test) on library models: Transformers decoders and BERT,
timm image models and a diffusers UNet at ``library.SIZES["bench"]`` (hidden 256, 4 layers, 2x128
tokens; 8x3x128x128 images), forward with no gradients, under eager PyTorch,
``torch.compile`` (Inductor) and ``torch.compile(backend="tessera")`` after substitution
on XLA (the default) and on Inductor (``options={"compiler": "inductor"}``), in one
process.
Prints the kernels graph mode took and the medians of ``--runs`` calls after warm-up;
ratios below 1 mean tessera is faster.

    .venv/bin/python python/examples/models/library_bench.py [--runs 10] [--models llama,vit]
"""

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import tessera  # noqa: E402
from models import library  # noqa: E402
from models.bench import median_ms  # noqa: E402

MODELS = library.DECODERS + ("bert",) + library.VISION + ("unet",)


def build(name):
    if name in library.DECODERS:
        return library.causal_lm(name, "bench").eval(), (library.tokens("bench"),)
    if name == "bert":
        return library.bert("bench").eval(), (library.tokens("bench"),)
    if name == "unet":
        unet, inputs = library.diffusion_unet("bench")
        return unet.eval(), inputs
    model, x = library.vision(name, "bench")
    return model.eval(), (x,)


def row(name, runs):
    model, inputs = build(name)
    out = {}
    with torch.no_grad():
        for label in ("eager", "inductor", "tessera", "tessera+inductor"):
            torch._dynamo.reset()
            tessera.reset_graph_stats()
            fn = {"eager": model, "inductor": torch.compile(model),
                  "tessera": torch.compile(model, backend="tessera"),
                  "tessera+inductor": torch.compile(model, backend="tessera", options={"compiler": "inductor"}),
                  }[label]
            out[label] = median_ms(lambda: fn(*inputs), runs)
            if label == "tessera":
                stats = tessera.graph_stats()
                out["kernels"] = ", ".join(f"{k} x{n}" for k, n in sorted(stats["kernels"].items())) or "none"
                out["eager graphs"] = len([k for k in stats["fallbacks"] if k.startswith("graph ")
                                           or k.endswith((".forward", ".backward"))])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.runs} calls, ms")
    print("| model | kernels taken | eager | Inductor | tessera (XLA) | tessera (Inductor) | XLA/eager | "
          "XLA/Inductor | Inductor-path/eager | Inductor-path/Inductor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = row(name, args.runs)
        eager_graphs = f" ({r['eager graphs']} graphs eager)" if r["eager graphs"] else ""
        t, ti = r["tessera"], r["tessera+inductor"]
        print(f"| {name} | {r['kernels']}{eager_graphs} | {r['eager']:.2f} | {r['inductor']:.2f} | {t:.2f} | "
              f"{ti:.2f} | {t / r['eager']:.2f} | {t / r['inductor']:.2f} | {ti / r['eager']:.2f} | "
              f"{ti / r['inductor']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
