"""``python -m tessera export MODULE:FUNCTION [--target tpu|cpu] [--out FILE]``: writes the
whole-model StableHLO of the model that ``FUNCTION()`` returns as ``(model,
example_args)`` (see ``tessera.export``). ``MODULE`` is imported from the current
directory or ``sys.path``; ``--path DIR`` adds a directory first.
``python -m tessera config`` lists every ``TESSERA_*`` variable with its value."""

import argparse
import importlib
import sys


def main(argv=None) -> int:
    """Runs ``python -m tessera`` with ``argv``; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m tessera", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a model's StableHLO with Tessera kernels as custom calls")
    e.add_argument("model", help="MODULE:FUNCTION returning (model, example_args)")
    e.add_argument("--target", choices=("tpu", "cpu"), default="tpu")
    e.add_argument("--out", help="output file (default: standard output)")
    e.add_argument("--mesh", type=int, default=1, help="TPU devices to shard over (one mesh axis)")
    e.add_argument("--path", action="append", default=[], help="a directory to import MODULE from")
    sub.add_parser("config", help="list every TESSERA_* variable with its value, default and what it does")
    args = p.parse_args(argv)
    if args.command == "config":
        import tessera

        print(tessera.config.describe(), end="")
        return 0
    sys.path[:0] = args.path
    module, _, function = args.model.partition(":")
    if not function:
        p.error(f"model: expected MODULE:FUNCTION, got {args.model!r}")
    try:
        factory = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as err:
        print(f"error: cannot load {args.model}: {err}", file=sys.stderr)
        return 2
    import tessera

    model, example = factory()
    try:
        text = tessera.export(model, *example, target=args.target, path=args.out, mesh=args.mesh)
    except (tessera.graph.GraphModeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {args.out} ({text.count('custom_call')} Tessera kernels)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
