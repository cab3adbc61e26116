"""The `paravt` command line.

Each stage package contributes its sub-commands through a small module exposing
`register(subparsers)`; that function adds its parsers and sets `func` to a callable taking
the parsed namespace and returning an exit code. Keeping the imports of torch,
transformers and friends inside those callables keeps `paravt --help` fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from paravt_core.config import ConfigError

# In the order a user meets them: run the pipeline, inspect configs, plan and check a GPU run, data,
# models, evaluation, rewards and RL replays, reports; then the miniature's own commands.
COMMAND_MODULES = (
    "flows.cli",
    "paravt_core.config_cli",
    "paravt_core.preflight_cli",
    "paravt_core.data.cli",
    "paravt_core.model.cli",
    "paravt_core.eval.cli",
    "paravt_core.rl.cli",
    "paravt_core.eval.report_cli",
    "paravt_core.miniature.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paravt", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


INPUT_ERROR = 2
FAILED = 1
# Where a command's outputs cannot be written (#61): the disk is full, or the folder is read-only
# or not ours. A one-line error naming the file at any command, not a traceback from deep inside.
FULL, UNWRITABLE = (errno.ENOSPC, errno.EDQUOT), (errno.EROFS, errno.EACCES, errno.EPERM)


def _storage_error(exc: BaseException) -> OSError | None:
    """The full-disk or unwritable-folder OSError behind `exc` (itself, or what caused it), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL + UNWRITABLE:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _storage_message(command: str, error: OSError) -> tuple[str, int]:
    """One line saying which file could not be written and what to do; the exit status."""
    where = error.filename or "(a file it names no further)"
    if error.errno in FULL:
        return (f"paravt {command}: no space left writing {where} ({error.strerror}); free space on that disk "
                "(df -h) or point the output elsewhere, then run the command again (finished stages are reused)",
                FAILED)
    if error.errno == errno.EROFS:
        return (f"paravt {command}: cannot write {where} ({error.strerror}): the file system is read-only; choose "
                "an output folder you can write to (--out, run.output_dir)", INPUT_ERROR)
    # EACCES / EPERM: a file the command read or wrote, not always an output
    return (f"paravt {command}: cannot access {where} ({error.strerror}): give this user access to it, or, "
            "where it is an output, choose an output folder you can write to (--out, run.output_dir)", INPUT_ERROR)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`paravt eval samples ... | head`): stop quietly, as Unix tools do,
        # and keep the interpreter's final flush from failing on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        storage = _storage_error(exc)
        if storage is not None:
            line, status = _storage_message(args.command, storage)
            print(line, file=sys.stderr)
            return status
        if not isinstance(exc, ConfigError):
            raise
        # A config that does not load is the user's input, whichever command read it: one line
        # naming the file and the key, never a traceback (issue #48 item 9).
        print(f"paravt {args.command}: {exc}", file=sys.stderr)
        return INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
