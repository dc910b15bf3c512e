"""Every ``TESSERA_*`` environment variable, from the one table the extension declares
(``runtime::config`` in Rust): :func:`get` reads one (an empty value counts as unset; a
name not in the table is a ``KeyError``), :func:`describe` lists them with their values
(``python -m tessera config``), and :func:`debug` writes through the ``tessera`` logger
when ``TESSERA_LOG=debug``. Values are read at each use, so a change made at run time
applies."""

import logging
import os
import sys

from . import _tessera

VARIABLES = {name: (default, doc) for name, default, doc in _tessera.config_variables()}
"""Name -> (default, what it does)."""

log = logging.getLogger("tessera")
"""The ``tessera`` logger; :func:`debug` writes its DEBUG records to stderr."""


def get(name: str, default: str = None):
    """The value of variable ``name`` in the environment, else ``default``."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a Tessera variable (see `python -m tessera config`)")
    return os.environ.get(name) or default


def debug_log() -> bool:
    """Whether ``TESSERA_LOG=debug``: the one place Python reads it."""
    return get("TESSERA_LOG") == "debug"


def debug(message: str) -> None:
    """Logs ``message`` at DEBUG on stderr when ``TESSERA_LOG=debug``."""
    if not debug_log():
        return
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("debug: tessera %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.DEBUG)
    log.debug(message)


def describe() -> str:
    """Every variable with its current value, default and what it does."""
    return _tessera.describe_config()
