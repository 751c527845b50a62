"""The run folder (`out_dir`) and every other output a command writes, owned in one place.

A run folder is created here (one line if it cannot be), locked for the run's lifetime (a second
process on the same folder stops at once, naming the holder's pid), checked before a new run
starts in it (a folder that holds a run is refused unless the user passes --overwrite=True, and
then the old run is moved aside to `<out_dir>.previous-<time>`, never deleted), and its
config.json is written atomically, after validation. A folder this module created for a command
that then failed is removed again, so bad input leaves nothing behind. A new run that fails after it
started (config.json written) but before it did any work (no checkpoint, no training record in
metrics.jsonl: an allocation failure at the first step, say) is rolled back too: the files it wrote
are removed, and the folder if it made it, so the same command can simply be run again. Files that
were there before are never touched, and an in-place resume is never rolled back. (The tools' other
outputs are outputs.py's.)
"""
import contextlib
import errno
import fcntl
import json
import os
import time

from tinylab.core.errors import UserError
from tinylab.core.fileio import write_atomic
from tinylab.core.metrics import read_metrics
from tinylab.core.outputs import RUN_FILES, check_creatable

LOCK_NAME = ".lock"
WORK_FILES = ("ckpt.pt", "ckpt_best.pt")  # a run that wrote one of these did work: never rolled back
WORK_RECORDS = ("train", "growth")  # ... or logged one of these kinds of records (tinylab/core/metrics.py)


def _reason(e: OSError) -> str:
    return os.strerror(e.errno).lower() if e.errno else str(e)


class RunDir:
    """out_dir of one run: `with RunDir(path) as rd:` creates and locks it; `rd.commit()` marks
    the run as started (the folder is then kept whatever happens; with rollback=True, kept once
    the run did work: see `close`)."""

    def __init__(self, path: str, what: str = "out_dir", enabled: bool = True):
        # enabled=False (DDP ranks other than 0): every method does nothing; rank 0 owns the folder
        self.path, self.what, self.enabled = path, what, enabled
        self.lock_fd = None
        self.created = []  # folders this process created, deepest first
        self.committed = False
        self.rollback = False  # commit(rollback=True): undo the start of a run that did no work
        self.written = []  # files in it this run created (write_json, track): what a rollback removes

    # -- create and lock

    def __enter__(self):
        if self.lock_fd is None:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb):
        failed = exc_type is not None and not (issubclass(exc_type, SystemExit) and exc.code in (0, None))
        self.close(failed)

    def open(self):
        if not self.enabled or self.lock_fd is not None:
            return self
        path = self.path
        if os.path.lexists(path) and not os.path.isdir(path):
            raise UserError(f"{self.what} {path} exists and is not a folder")
        check_creatable(path, self.what)
        p = os.path.abspath(path)
        while not os.path.isdir(p):
            self.created.append(p)
            p = os.path.dirname(p)
        try:
            os.makedirs(path, exist_ok=True)
            self.lock_fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self._remove_created()
            raise UserError(f"cannot create {self.what} {path}: {_reason(e)}") from None
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self.lock_fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.lock_fd)
            self.lock_fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise UserError(f"{self.what} {path} is in use by another run (pid {holder}); wait for it to finish "
                                f"or choose another {self.what}") from None
            raise UserError(f"cannot lock {self.what} {path}: {_reason(e)}") from None
        os.ftruncate(self.lock_fd, 0)
        os.pwrite(self.lock_fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def close(self, failed=False):
        """Release the lock; a folder created for a run that never started is removed again, and
        after a failure (`failed`) of a run committed with rollback=True that did no work
        (`did_work`), the files it wrote are removed and it counts as never started."""
        if self.lock_fd is None:
            return
        if failed and self.committed and self.rollback and not self.did_work():
            for name in reversed(self.written):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.path, name))
            self.committed = False
        if not self.committed and self.created:
            # only in a folder this process made (and removes): unlinking a lock file another
            # process may have open would let a third one lock a fresh file beside it. Unlinked
            # while still held, so whoever opened it already fails its own flock
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.path, LOCK_NAME))
        os.close(self.lock_fd)  # releases the flock
        self.lock_fd = None
        if not self.committed:
            self._remove_created()

    def _remove_created(self):
        for d in self.created:
            with contextlib.suppress(OSError):
                os.rmdir(d)  # only if empty: never anything the user put there

    # -- what is in it

    def run_files(self):
        return [f for f in RUN_FILES if os.path.lexists(os.path.join(self.path, f))]

    def check_new_run(self, overwrite: bool, hint="resume it with --init_from=resume_train"):
        """A new run (iteration 0) must not land on an old one unless the user said so."""
        found = self.run_files() if self.enabled else []
        if found and not overwrite:
            raise UserError(f"{self.what} {self.path} already holds a run ({', '.join(found)}); {hint}, choose another "
                            f"{self.what}, or pass --overwrite=True to move the old run aside")

    def move_aside(self) -> str:
        """Move every entry but the lock into a new sibling folder <path>.previous-<time>."""
        if not self.enabled:
            return ""
        entries = [e for e in os.listdir(self.path) if e != LOCK_NAME]
        if not entries:
            return ""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"{os.path.normpath(self.path)}.previous-{stamp}"
        aside, n = base, 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{base}-{n}"
        os.makedirs(aside)
        for e in sorted(entries):
            os.rename(os.path.join(self.path, e), os.path.join(aside, e))
        print(f"notice: moved the previous run in {self.path} to {aside} (--overwrite=True)")
        return aside

    def commit(self, rollback=False):
        """The run starts: from here on the folder is the user's, kept whatever happens; with
        `rollback`, unless the run fails before it did any work (`close`)."""
        self.committed, self.rollback = True, rollback

    def track(self, name: str):
        """`name` is about to be written by this run: if it is not there yet, it is this run's (a
        rollback removes it)."""
        if self.enabled and name not in self.written and not os.path.lexists(os.path.join(self.path, name)):
            self.written.append(name)

    def did_work(self) -> bool:
        """A checkpoint, or a training / growth record in metrics.jsonl: what the run did is kept."""
        if any(os.path.lexists(os.path.join(self.path, f)) for f in WORK_FILES):
            return True
        path = os.path.join(self.path, "metrics.jsonl")
        try:
            return any(r.get("kind") in WORK_RECORDS for r in read_metrics(path, notice=False))
        except OSError:
            return os.path.lexists(path)  # unreadable: keep it

    def write_json(self, name: str, obj):
        if not self.enabled:
            return
        self.track(name)
        write_atomic(os.path.join(self.path, name), (json.dumps(obj, indent=1) + "\n").encode())
