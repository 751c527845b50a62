"""Atomic writes, used by everything that writes files users rely on (datasets, checkpoints,
exports, plots, config.json, metrics rewrites): write to a temp name beside the target, fsync,
rename. A crash, a full disk or Ctrl-C at any moment leaves the old file (or nothing) and no
temp file, never a truncated file. An OSError from the write names the target path.
"""
import contextlib
import os
import shutil
import tempfile

from tinylab.core.errors import UserError
from tinylab.core.outputs import move_aside


def read_text(path: str, what: str = "file") -> str:
    """The UTF-8 text of a file the user named, or a one-line UserError: a folder, "<what> not
    found: <path>", or not UTF-8 (naming the byte)."""
    if os.path.isdir(path):
        raise UserError(f"{what} {path} is a folder, not a file")
    if not os.path.isfile(path):
        raise UserError(f"{what} not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str, parents: bool = False):
    """Open a temp file beside `path`; on success fsync and rename it over `path`, on failure
    delete it. `parents`: create missing parent folders first, and remove them again on failure."""
    created = _make_parents(path) if parents else []
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp_", dir=os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        _remove_folders(created)
        raise _named(e, path) from None
    try:
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        _remove_folders(created)
        if isinstance(e, OSError):
            raise _named(e, path) from None
        raise


def _make_parents(path: str) -> list:
    """Create the missing folders above `path`; returns them, deepest first."""
    parent = os.path.dirname(os.path.abspath(path))
    created, p = [], parent
    while not os.path.isdir(p):
        created.append(p)
        p = os.path.dirname(p)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        _remove_folders(created)
        raise _named(e, path) from None
    return created


def _remove_folders(folders):
    for d in folders:  # only empty ones: never anything else that is there
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _named(e: OSError, path: str) -> OSError:
    """The same error, naming the file the user asked for (a failed write names nothing, a
    failed temp file names the temp)."""
    if e.filename is not None and e.filename != path and os.path.basename(str(e.filename)).startswith(".tmp"):
        e = OSError(e.errno, e.strerror)
    return e if e.filename is not None else OSError(e.errno, e.strerror, path)


def write_atomic(path: str, data: bytes):
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def building_dir(final: str):
    """Yield a hidden temp folder beside `final`; when the block succeeds it becomes `final` (an
    older one, which the output guard let through with --force, is moved aside to
    `<final>.previous-<time>`, never deleted), otherwise it is deleted, together with any parent
    folders this created, so a failed command leaves nothing behind."""
    parent = os.path.dirname(os.path.abspath(final))
    created = []
    p = parent
    while not os.path.isdir(p):
        created.append(p)
        p = os.path.dirname(p)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    except OSError as e:  # named by the folder asked for, not by a temp name that never existed
        for d in created:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise OSError(e.errno, e.strerror, final) from None
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700; give what makedirs would
        yield tmp
        # two renames: the old folder is moved aside first, the window without a complete
        # folder is two system calls long, and never shows a partial one
        move_aside(final)
        os.rename(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        if isinstance(e, OSError) and (e.filename is None or _inside(e.filename, tmp)):
            # a failed write inside the temp folder (a full disk) names what the user asked for,
            # not the hidden temp folder that was just deleted (a plain f.write names nothing)
            where = final if e.filename is None else os.path.join(final, os.path.relpath(os.fspath(e.filename), tmp))
            raise OSError(e.errno, e.strerror, where) from None
        raise


def _inside(path, folder) -> bool:
    if not isinstance(path, (str, os.PathLike)):
        return False
    path = os.path.abspath(os.fspath(path))
    return path == folder or path.startswith(folder + os.sep)
