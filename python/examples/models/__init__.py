"""Real architectures at small widths for graph mode (``torch.compile(backend="tessera")``):
minGPT, a Llama/Qwen-style decoder, a ResNet-18-style CNN, a small UNet and a small
DLRM. Everything is defined here and the data is generated: nothing is downloaded.

``ZOO`` maps a name to ``(build, example_inputs)``; ``bench.py`` times them.
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


def build(name: str, seed: int = 0):
    """The model ``name`` (eval mode, seeded weights) and its example inputs."""
    make, inputs = ZOO[name]
    torch.manual_seed(seed)
    model = make().eval()
    return model, inputs()
