"""Graph-mode benchmark (not a test) on library models: Transformers decoders and BERT,
timm image models and a diffusers UNet at ``library.SIZES["bench"]`` (hidden 256, 4 layers, 2x128
tokens; 8x3x128x128 images), forward with no gradients (or a training step), under eager PyTorch,
``torch.compile`` (Inductor), ``torch.compile(backend="tessera")`` on Inductor (the
default: ``kernels="auto"`` substitutes the kernel families that make the graph faster),
and the same with ``options={"kernels": "all"}`` (every kernel substituted) and
``"none"`` (nothing substituted), in one process: compiled and warmed
up, then called in turn for ``--runs`` rounds, each round in a rotated order (so neither
a slow spell of the machine nor going first or last favours one). ``--train`` times
one training step instead (the model in training mode: forward, the mean square of its
first output, backward, gradients cleared). ``--xla`` adds
the XLA path (``options={"compiler": "xla"}``; ``TESSERA_XLA_CLIENT`` picks the client),
timed against eager in a process of its own: XLA's CPU client slows whatever else runs
in its process. Prints
the kernels ``auto`` took (whether it measured or read its choice, and the graphs it
runs eagerly or compiles without Inductor's layout optimization) and the medians;
ratios below 1 mean tessera is faster.

    .venv/bin/python python/examples/models/library_bench.py [--runs 10] [--models llama,vit] [--train] [--xla]
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import tessera  # noqa: E402
from models import library  # noqa: E402

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


def _step(fn, model, inputs, train):
    """One timed call: ``fn``'s forward, or with ``train`` a training step."""
    if not train:
        return lambda: fn(*inputs)

    def step():
        out = fn(*inputs)
        out = out if isinstance(out, torch.Tensor) else out[0]
        out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    return step


MAIN = ("eager", "inductor", "tessera", "all kernels", "no kernels")


def row(name, runs, labels=MAIN, train=False):
    """Medians (ms) of ``name`` under each of ``labels`` (the compilers below), and what
    ``auto`` took when ``tessera`` is among them."""
    model, inputs = build(name)
    model.train(train)
    compilers = {
        "eager": lambda: model,
        "inductor": lambda: torch.compile(model),
        "tessera": lambda: torch.compile(model, backend="tessera"),
        "all kernels": lambda: torch.compile(model, backend="tessera", options={"kernels": "all"}),
        "no kernels": lambda: torch.compile(model, backend="tessera", options={"kernels": "none"}),
        "tessera+xla": lambda: torch.compile(model, backend="tessera", options={"compiler": "xla"}),
    }
    torch._dynamo.reset()
    fns, out = {}, {}
    with torch.set_grad_enabled(train):
        for label in labels:
            tessera.reset_graph_stats()
            fns[label] = _step(compilers[label](), model, inputs, train)
            fns[label]()
            fns[label]()
            if label == "tessera":
                stats = tessera.graph_stats()
                out["kernels"] = ", ".join(f"{k} x{n}" for k, n in sorted(stats["kernels"].items())) or "none"
                out["how"] = _how(stats["choices"].values())
                out["eager graphs"] = len(
                    [k for k in stats["fallbacks"] if k.startswith("graph ") or k.endswith((".forward", ".backward"))]
                )
        times = {label: [] for label in fns}
        for i in range(runs):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                start = time.perf_counter()
                fns[label]()
                times[label].append(time.perf_counter() - start)
    out.update({label: 1e3 * statistics.median(t) for label, t in times.items()})
    return out


def xla_row(name, runs, train):
    """Eager and the XLA path timed in a process of their own (XLA's CPU client slows
    whatever else runs in its process)."""
    command = [sys.executable, __file__, "--xla-alone", "--models", name, "--runs", str(runs)]
    done = subprocess.run(command + (["--train"] if train else []), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _how(choices) -> str:
    """How ``auto`` decided (measured or stored), and the graphs it runs eagerly or
    compiles without Inductor's layout optimization."""
    choices = list(choices)
    parts = sorted({c["how"].split(" (")[0] for c in choices})
    eager = sum(c.get("compiler") == "eager" for c in choices)
    plain = sum(c.get("inductor", {}).get("layout_optimization") is False for c in choices)
    parts += [f"{eager} graphs eager"] if eager else []
    parts += [f"{plain} graphs without layout optimization"] if plain else []
    return ", ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--xla", action="store_true", help="also time the XLA path (in a process of its own)")
    parser.add_argument("--xla-alone", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--train", action="store_true", help="time a training step instead of a forward")
    args = parser.parse_args()
    if args.xla_alone:
        print(json.dumps(row(args.models, args.runs, ("eager", "tessera+xla"), args.train)))
        return
    what = "training steps" if args.train else "calls"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.runs} {what}, ms")
    xla_head = ("", "")
    if args.xla:
        xla_head = (" eager (XLA's process) | tessera (XLA path) | XLA path/eager |", "---|---|---|")
    print(
        "| model | kernels taken (auto) | eager | Inductor | tessera | all kernels | no kernels | tessera/eager "
        f"| tessera/Inductor | all kernels/Inductor | no kernels/Inductor |{xla_head[0]}"
    )
    print(f"|---|---|---|---|---|---|---|---|---|---|---|{xla_head[1]}")
    for name in args.models.split(","):
        r = row(name, args.runs, train=args.train)
        eager_graphs = f" ({r['eager graphs']} graphs eager)" if r["eager graphs"] else ""
        t, inductor = r["tessera"], r["inductor"]
        line = (
            f"| {name} | {r['kernels']} ({r['how']}){eager_graphs} | {r['eager']:.2f} | {inductor:.2f} | {t:.2f} | "
            f"{r['all kernels']:.2f} | {r['no kernels']:.2f} | {t / r['eager']:.2f} | {t / inductor:.2f} | "
            f"{r['all kernels'] / inductor:.2f} | {r['no kernels'] / inductor:.2f} |"
        )
        if args.xla:
            x = xla_row(name, args.runs, args.train)
            line += f" {x['eager']:.2f} | {x['tessera+xla']:.2f} | {x['tessera+xla'] / x['eager']:.2f} |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
