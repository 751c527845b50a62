"""One way to report bad input: a single clear line on stderr and a non-zero exit.

Every command-line entry point wraps its main() with `cli_main`, and library code raises
`UserError` for anything the user can fix (bad flag, missing dataset, incompatible checkpoint).
Genuine bugs still raise ordinary exceptions and show a traceback.
"""
import sys


class UserError(Exception):
    """An error caused by the user's input; printed as one line, never as a traceback."""


def cli_main(main, *args, **kwargs):
    """Run `main`, turning UserError (and Ctrl-C before training starts) into a one-line exit."""
    try:
        return main(*args, **kwargs)
    except UserError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"error: {msg}", file=sys.stderr, flush=True)
        sys.exit(2)


def first_line(e: BaseException, limit: int = 160) -> str:
    """`TypeName: first line of the message` of an exception, for one-line errors (many library
    exceptions have multi-line messages, and some, like EOFError from an empty file, none)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit]}" if lines else type(e).__name__

