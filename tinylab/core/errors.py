"""The one error boundary: what a user sees when something goes wrong is one line and an exit code.

Every command-line entry point runs its main() through `cli_main`:
    UserError           (bad input the user can fix)          -> "error: <message>", exit 2
    OSError             (full disk, read-only, not a folder,  -> "error: <path>: <cause>", exit 1
                         permission, a file that vanished)
    KeyboardInterrupt   (Ctrl-C at any moment)                -> "error: interrupted", exit 130
                        (temp files are removed by the writers' own cleanup; the training loop's
                        SIGINT checkpoint is written before this point)
    an allocation that  (MemoryError, numpy's too; torch's     -> "error: out of memory: <what failed>
    failed              OutOfMemoryError; a RuntimeError of       (lower ...)", exit 1
                        an allocator: ALLOCATION_FAILURES)
    OverflowError       (a size beyond what torch / numpy     -> "error: a number too large: ...", exit 1
                        index with)
Sizes are checked against the memory available before the work starts (tinylab/core/memory_budget.py);
what still fails to allocate (the estimate is a lower bound) ends here as one line.
Library warnings (torch, datasets, transformers) are silenced unless the user asks for them with
python -W or PYTHONWARNINGS; the project's own notices are single printed lines. Genuine bugs
still raise ordinary exceptions and show a traceback.

A command's process ends faster through it too (`leave_program`).
"""
import gc
import logging
import os
import re
import sys
import warnings


class UserError(Exception):
    """An error caused by the user's input; printed as one line, never as a traceback."""


def first_line(e: BaseException, limit: int = 160) -> str:
    """`TypeName: first line of the message` of an exception, for one-line errors (many library
    exceptions have multi-line messages, and some, like EOFError from an empty file, none)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit]}" if lines else type(e).__name__


# what allocators say when they cannot allocate: torch's CPU allocator ("[enforce fail at
# alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"),
# CUDA's ("CUDA out of memory"), MPS's ("MPS backend out of memory"), others' "not enough memory"
ALLOCATION_FAILURES = ("can't allocate memory", "not enough memory", "out of memory", "defaultcpuallocator")
SIZE_HINT = "(lower batch_size, max_seq_len or the model's size)"


def is_allocation_failure(e: BaseException) -> bool:
    """MemoryError, torch.OutOfMemoryError (torch is not imported here: known by its class name),
    or a RuntimeError whose message is an allocator's failure; other RuntimeErrors are bugs."""
    if isinstance(e, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e).lower() for m in ALLOCATION_FAILURES)


def allocation_line(e: BaseException) -> str:
    """'out of memory: <the failure's first line, without the allocator's source location>'."""
    text = first_line(e, 200)
    text = re.sub(r"\[enforce fail at [^\]]*\] (err == 0\. )?", "", text)
    return f"out of memory: {text} {SIZE_HINT}"


def os_error_line(e: OSError) -> str:
    """'<path>: <cause>' (or '<path> -> <path2>: <cause>') of an OSError, in lower case."""
    cause = (e.strerror or str(e) or type(e).__name__).strip()
    cause = cause[0].lower() + cause[1:] if cause else cause
    where = [str(p) for p in (e.filename, e.filename2) if p is not None]
    return f"{' -> '.join(where)}: {cause}" if where else cause


def quiet_library_warnings():
    """No extra lines from libraries: warnings off (unless -W / PYTHONWARNINGS), the HF
    libraries' loggers at errors only."""
    if not sys.warnoptions:
        warnings.simplefilter("ignore")
    for name in ("datasets", "transformers", "huggingface_hub", "filelock", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _fail(message: str, code: int):
    sys.stdout.flush()
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def _interrupted_while_loading(exc_type, exc, tb, _previous=sys.excepthook):
    """Ctrl-C before cli_main runs, while a command's modules still load (`import torch` alone
    takes a second or two): nothing has been written yet, so the same line and exit code as at
    any later moment, not an import traceback. Installed when the package is first imported
    (tinylab/__init__.py), which every entry script does before it imports torch."""
    if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001  a closed or broken stdout must not hide the line
            pass
        print("error: interrupted", file=sys.stderr, flush=True)
        os._exit(130)  # an uncaught KeyboardInterrupt would otherwise end the process by SIGINT
    _previous(exc_type, exc, tb)


def install_interrupt_hook():
    if sys.excepthook is not _interrupted_while_loading:
        sys.excepthook = _interrupted_while_loading


def leave_program():
    """Call when the process is about to exit: everything alive now lives until then, so
    gc.freeze() takes it out of the collector's reach and the interpreter's final collections
    do not walk the million objects torch's compiler stack leaves (0.8 s of every command's exit,
    measured with torch._dynamo imported, as every training run has it)."""
    gc.freeze()


def _leaving_the_program(main):
    """cli_main's exit: the program's own main (`python train.py`, torchrun's workers: its module
    is __main__) leaves the program. Not in-process callers (tests call cli_main on an imported
    main): their garbage must stay collectable."""
    if getattr(main, "__module__", None) == "__main__":
        leave_program()


def cli_main(main, *args, **kwargs):
    """Run `main` behind the error boundary (see the module docstring)."""
    quiet_library_warnings()
    try:
        return _run(main, *args, **kwargs)
    finally:
        _leaving_the_program(main)


def _run(main, *args, **kwargs):
    try:
        return main(*args, **kwargs)
    except UserError as e:
        _fail(str(e), 2)
    except BrokenPipeError:
        # the reader of our stdout went away (`... | head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:
        _fail(os_error_line(e), 1)
    except KeyboardInterrupt:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # off the ^C on the terminal line
        _fail("interrupted", 130)
    except (MemoryError, RuntimeError) as e:
        if not is_allocation_failure(e):
            raise  # a genuine bug: its traceback
        _fail(allocation_line(e), 1)
    except OverflowError as e:
        _fail(f"a number too large: {first_line(e)} {SIZE_HINT}", 1)
