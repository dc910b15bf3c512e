"""PyTorch's dtypes as Tessera names them, from the one table of them in Rust
(``kernels::torch_op::DTYPES``, through ``_tessera.dtypes()``)."""

import torch

from . import _tessera


def _torch(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


KERNEL = {_torch(t): kernel for t, kernel, _ in _tessera.dtypes() if kernel}
"""torch dtype -> the name of the dtype Tessera's kernels take it as (``f32``, ...)."""

TORCH = {kernel: dtype for dtype, kernel in KERNEL.items()}
"""The kernels' dtype name -> torch dtype (``KERNEL`` reversed)."""

ELEMENT = {_torch(t): element for t, _, element in _tessera.dtypes()}
"""torch dtype -> the runtime's element name (what graph mode's XLA runner carries)."""
