"""Tessera kernels as PyTorch ops: ``torch.ops.tessera.*``.

Importing this package registers the ops with PyTorch's dispatcher: a CPU kernel in
the extension (Rust, registered through PyTorch's stable C interface) that runs the
Tessera kernel (native > XLA > interpreter, see ``tessera.explain``), a fake (meta)
kernel for ``torch.compile``, and autograd (attention through the FlashAttention
backward kernel, the others through PyTorch's math).

    import torch, tessera
    y = torch.ops.tessera.softmax(x)
    with tessera.backend("interp"):
        o = torch.ops.tessera.flash_attention(q, k, v, is_causal=True)
"""

import contextlib
import sys
import warnings

import torch

from . import _tessera, config

__all__ = [
    "autograd_kernels",
    "backend",
    "disable_sdpa_override",
    "enable_sdpa_override",
    "explain",
    "explain_graph",
    "export",
    "graph_stats",
    "load_library",
    "OpTrace",
    "reset_graph_stats",
    "thread_pool",
    "trace_ops",
]


def _backend() -> str:
    return _tessera.current_backend()


@contextlib.contextmanager
def backend(name: str):
    """Forces a backend (``interp``, ``xla``, ``native`` or ``auto``) for the ops this
    thread runs inside the block."""
    if name not in ("interp", "xla", "native", "auto"):
        raise ValueError(f"backend: expected interp, xla, native or auto, got {name!r}")
    previous = _tessera.set_backend(name)
    try:
        yield
    finally:
        _tessera.set_backend(previous)


def explain(kernel: str, **params) -> tuple:
    """The backend ``kernel`` would run on with these parameters, and why better
    backends were skipped: ``(backend, [reasons])``."""
    return _tessera.explain(kernel, ops.param_items(params), _backend())


# ---- the ops, their autograd and the SDPA override ----------------------------------

from . import autograd, ops, sdpa  # noqa: E402, F401 (registers the ops)
from .autograd import autograd_kernels  # noqa: E402
from .sdpa import disable_sdpa_override, enable_sdpa_override  # noqa: E402

# Native grids run on PyTorch's own OpenMP threads (ATen's intra-op pool, sized by
# torch.set_num_threads), which PyTorch keeps spinning between its ops: Tessera's own
# threads would compete with them for the cores. TESSERA_THREAD_POOL=tessera keeps
# Tessera's threads (for comparison).
if config.get("TESSERA_THREAD_POOL", "openmp") != "tessera":
    try:
        _tessera.use_torch_threads()
    except RuntimeError as _e:  # a PyTorch built without OpenMP: Tessera's own threads
        warnings.warn(f"tessera: native kernels use their own threads: {_e}", stacklevel=2)


def thread_pool() -> str:
    """What runs native kernels' grids with the calling thread: ``"openmp"``
    (PyTorch's intra-op threads) or ``"tessera"`` (Tessera's own)."""
    return _tessera.thread_pool()


# ---- the op tracer: tessera.trace_ops() ----------------------------------------------

from .trace import OpTrace, trace_ops  # noqa: E402

# ---- DTensor sharding rules (tensor parallelism) --------------------------------------

if torch.distributed.is_available():
    try:
        from . import distributed  # noqa: E402, F401
    except ImportError as e:  # DTensor's experimental API moved: the ops still work
        warnings.warn(f"tessera: no DTensor sharding rules ({e}): DTensor calls of the ops will fail", stacklevel=2)

# ---- user op libraries (tessera.load_library) and graph mode (backend="tessera") -----

from .graph import explain_graph, export, graph_stats, reset_graph_stats, tessera_backend  # noqa: E402
from .library import load_library  # noqa: E402


def _register_backend():
    """Registers the Dynamo backend ``tessera`` (unless Dynamo found the package's
    ``torch_dynamo_backends`` entry point, through which it registers it itself)."""
    from torch._dynamo.backends import registry

    if "tessera" not in registry._COMPILER_FNS and registry._BACKENDS.get("tessera") is None:
        registry.register_backend(tessera_backend, name="tessera")


_register_backend()

# ---- Hugging Face Transformers: attn_implementation="tessera" -------------------------

from . import hf  # noqa: E402

if "transformers" in sys.modules:  # importing it here would cost seconds
    try:
        hf.register()
    except ImportError as _e:  # a Transformers without AttentionInterface
        warnings.warn(f"tessera: attn_implementation='tessera' is not registered: {_e}", stacklevel=2)
