"""Graph-mode benchmark (not a test): every zoo model's forward (at ``BENCH`` sizes)
under eager PyTorch, ``torch.compile`` (Inductor) and ``torch.compile(backend="tessera")``
in one process, the minGPT training step likewise, and tessera's compile times (cold,
memory-warm, disk-warm). Medians of ``--runs`` calls after warm-up; ratios below 1 mean tessera is
faster.

    .venv/bin/python python/examples/models/bench.py [--runs 20] [--models mingpt,llama]
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import tessera  # noqa: E402, F401 - registers the "tessera" backend
from models import BENCH, ZOO, build, mingpt  # noqa: E402


def median_ms(f, runs):
    f()
    f()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def forward_row(name, runs):
    model, inputs = build(name, size="bench")
    out = {}
    with torch.no_grad():
        for label, fn in (
            ("eager", model),
            ("inductor", torch.compile(model)),
            ("tessera", torch.compile(model, backend="tessera")),
        ):
            torch._dynamo.reset()
            out[label] = median_ms(lambda fn=fn: fn(*inputs), runs)
    return out


def train_row(runs):
    out = {}
    for label in ("eager", "inductor", "tessera"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model_args, input_args = BENCH["mingpt"]
        model = mingpt.GPT(**model_args)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        forward = {
            "eager": model,
            "inductor": torch.compile(model),
            "tessera": torch.compile(model, backend="tessera"),
        }[label]
        x, y = next(mingpt.batches(**input_args))

        def step(forward=forward, x=x, y=y, opt=opt):
            loss = F.cross_entropy(forward(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()

        out[label] = median_ms(step, runs)
    return out


COMPILE_SCRIPT = """
import sys, time, torch, tessera
sys.path.insert(0, {examples!r})
from models import build
m, x = build({name!r}, size="bench")
with torch.no_grad():
    t = time.perf_counter(); torch.compile(m, backend='tessera')(*x); first = time.perf_counter() - t
    torch._dynamo.reset()
    t = time.perf_counter(); torch.compile(m, backend='tessera')(*x); again = time.perf_counter() - t
print(first * 1e3, again * 1e3, tessera.graph_stats()['cache_hits'])
"""


def compile_times(name):
    """First-call times (ms) with empty cache dirs, Tessera's and Inductor's (cold), after
    ``dynamo.reset()`` in the same process (memory-warm) and in a new process
    (disk-warm)."""
    examples = str(pathlib.Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TESSERA_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
        script = COMPILE_SCRIPT.format(examples=examples, name=name)
        runs = [
            subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)
        ]
    cold, memory, _ = runs[0].stdout.split(maxsplit=2)
    disk = runs[1].stdout.split()[0]
    return float(cold), float(memory), float(disk)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--models", default=",".join(ZOO))
    args = p.parse_args()
    names = args.models.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {args.runs} calls (ms)")
    print(
        f"{'model':<16}{'eager':>9}{'inductor':>10}{'tessera':>9}{'t/eager':>9}{'t/ind.':>8}"
        f"{'cold':>8}{'mem':>7}{'disk':>7}"
    )
    rows = [(n, forward_row(n, args.runs), compile_times(n)) for n in names]
    if "mingpt" in names:
        rows.append(("mingpt train", train_row(args.runs), None))
    for name, r, c in rows:
        comp = "".join(f"{v:>7.0f}" for v in c) if c else ""
        print(
            f"{name:<16}{r['eager']:>9.2f}{r['inductor']:>10.2f}{r['tessera']:>9.2f}"
            f"{r['tessera'] / r['eager']:>9.2f}{r['tessera'] / r['inductor']:>8.2f} {comp}"
        )


if __name__ == "__main__":
    main()
