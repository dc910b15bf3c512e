"""Real architectures at small widths for graph mode (``torch.compile(backend="tessera")``):
minGPT, a Llama/Qwen-style decoder, a ResNet-18-style CNN, a small UNet and a small
DLRM. Everything is defined here and the data is generated: nothing is downloaded.

``ZOO`` maps a name to ``(build, example_inputs)`` at the small sizes the tests use;
``BENCH`` gives each model's constructor and input arguments at the medium sizes
``bench.py`` times (where per-call overheads no longer dominate).
"""

import torch

from .dlrm import DLRM, dlrm_inputs
from .llama import Llama, llama_inputs
from .mingpt import GPT, gpt_inputs
from .resnet import resnet18, resnet_inputs
from .unet import UNet, unet_inputs

ZOO = {
    "mingpt": (GPT, gpt_inputs),
    "llama": (Llama, llama_inputs),
    "resnet18": (resnet18, resnet_inputs),
    "unet": (UNet, unet_inputs),
    "dlrm": (DLRM, dlrm_inputs),
}


BENCH = {
    "mingpt": (dict(dim=256, heads=8, layers=4, block=128), dict(batch=4, block=128)),
    "llama": (dict(dim=256, heads=8, kv_heads=2, hidden=704, layers=4), dict(batch=2, seq=128)),
    "resnet18": (dict(widths=(64, 128, 256, 512)), dict(batch=8)),
    "unet": (dict(width=32), dict(batch=4, size=64)),
    "dlrm": (dict(dim=64, tables=(10000, 8000, 6000)), dict(batch=512, tables=(10000, 8000, 6000))),
}


def build(name: str, seed: int = 0, size: str = "test"):
    """The model ``name`` (eval mode, seeded weights) and its example inputs, at the
    tests' sizes (``size="test"``) or the benchmark's (``"bench"``)."""
    make, inputs = ZOO[name]
    model_args, input_args = BENCH[name] if size == "bench" else ({}, {})
    torch.manual_seed(seed)
    model = make(**model_args).eval()
    return model, inputs(**input_args)


def llama_for_export():
    """The Llama-style decoder and its inputs (for ``python -m tessera export
    models:llama_for_export``)."""
    return build("llama")
