"""Graph mode's XLA path on jaxlib's in-process CPU client.

When jaxlib is installed (``make python`` installs it), the XLA path compiles and runs
its StableHLO on jaxlib's own CPU client rather than the pinned PJRT plugin
(``TESSERA_XLA_CLIENT=plugin`` picks the plugin): the transformer programs run in
0.74-0.86 of the plugin's time and ConvNeXt's in 0.79; ResNet-18's and the UNet's
in 1.03-1.08 (``python/examples/models/library_bench.py --xla``). The
``tessera_op`` custom calls in those programs reach the extension's XLA FFI handler,
registered with jaxlib from the capsule the extension exports. Tensors go in and come
out through DLPack without copies. Executables are cached by the extension's two-tier
cache (``xla-jaxlib/`` in the cache directory), which calls :class:`_Bridge` to compile,
serialize and load them.
"""

import atexit
import contextlib
import gc
import hashlib
import os
import platform
import weakref

import torch

from .. import _tessera
from . import lower

_client = None
_unavailable = None
_RELEASED = "jaxlib's client was released at exit"


def unavailable() -> str:
    """Why jaxlib's CPU client cannot run graph mode's programs here ('' if it can)."""
    _load()
    return _unavailable


def compile_module(text: str):
    """``(run, source, ms)`` for StableHLO module ``text``: ``run(inputs)`` takes the
    contiguous CPU tensors the program takes and returns its results; ``source`` says
    where the executable came from (``compiled``, ``memory``, ``disk``)."""
    if unavailable():
        raise RuntimeError(unavailable())
    exe, source, ms = _tessera.jaxlib_compile(_Bridge(), text)
    return _Run(exe, _client.devices()[0]), source, ms


class _Run:
    """``run(inputs) -> results`` on loaded executable ``exe``: the tensors lent to XLA
    through DLPack, XLA's results handed back the same way. :func:`_release` takes the
    executable away at exit."""

    def __init__(self, exe, device):
        from jaxlib import _jax

        self.exe, self.device = exe, device
        self.to_jax = _jax.dlpack_managed_tensor_to_buffer
        _runs.add(self)

    def __call__(self, inputs: list) -> list:
        if self.exe is None:
            raise RuntimeError(_RELEASED)
        arrays = [self.to_jax(t.detach().__dlpack__(), self.device, None, None) for t in inputs]
        results = self.exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
        return [torch.from_dlpack(r[0]) for r in results]


_runs: "weakref.WeakSet[_Run]" = weakref.WeakSet()


def _release():
    """Lets the client and every executable go before the interpreter exits: a client
    still alive when C++'s static destructors run can abort the process (seen in about
    1 exit in 4 on a loaded machine). Graphs compiled later use the plugin."""
    global _client, _unavailable
    for run in list(_runs):
        run.exe = run.device = None
    _client, _unavailable = None, _RELEASED
    _tessera.jaxlib_release()
    gc.collect()


class _Bridge:
    """What the extension's cache calls to compile, serialize and load executables."""

    def fingerprint(self) -> str:
        """Names the compiler in every cache key: jaxlib's version, its platform and the
        host CPU (XLA compiles for its features)."""
        import jaxlib

        client = _load()
        return f"jaxlib {jaxlib.__version__}|{client.platform} {client.platform_version}|host {_host()}"

    def compile(self, text: str):
        """Compiles StableHLO module ``text`` for the client's one device."""
        from jaxlib import _jax, xla_client

        client = _load()
        return client.compile_and_load(text, _jax.DeviceList(tuple(client.devices()[:1])), xla_client.CompileOptions())

    def serialize(self, exe) -> bytes:
        """The executable as bytes for the disk tier."""
        return _load().serialize_executable(exe)

    def deserialize(self, data: bytes):
        """An executable from :meth:`serialize`'s bytes."""
        from jaxlib import _jax

        client = _load()
        return client.deserialize_executable(data, _jax.DeviceList(tuple(client.devices()[:1])))


def _host() -> str:
    """The host CPU's model and features, hashed."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.machine(), platform.processor()]
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def _load():
    """The client, created on first use with Tessera's custom-call handler registered
    (``None`` when jaxlib cannot be used, ``_unavailable`` saying why)."""
    global _client, _unavailable
    if _client is not None or _unavailable is not None:
        return _client
    try:
        with _quiet_native_logs():
            from jaxlib import xla_client

            client = xla_client.make_cpu_client()
        xla_client.register_custom_call_target(
            lower.TARGET, _tessera.custom_call_handler(), platform="cpu", api_version=1
        )
    except Exception as e:  # noqa: BLE001 - any failure means: use the plugin
        _unavailable = f"jaxlib's CPU client: {type(e).__name__}: {e}"
        return None
    _client, _unavailable = client, ""
    atexit.register(_release)
    return _client


@contextlib.contextmanager
def _quiet_native_logs():
    """jaxlib's C++ logs INFO lines to stderr as it creates a client; keep them to
    warnings unless the user set the level."""
    saved = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
