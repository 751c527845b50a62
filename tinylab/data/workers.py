"""The worker processes of the data stages (synthesize, pretokenize): one task per raw shard.

Each worker has a pipe of its own: the parent sends it one task at a time and it sends back the
result (or the exception it raised). Nothing is shared between workers, so stopping them early,
on a failed shard or Ctrl-C, is a plain kill. (multiprocessing.Pool shares one result queue,
guarded by a lock between processes: Pool.terminate killing a worker while it held that lock, in
the middle of sending a result, left the parent waiting forever for a lock no one would release.)
A worker that dies without a result (killed, out of memory) is noticed at once, not waited for.
"""
import multiprocessing
import os
import signal
from multiprocessing.connection import wait

_STOP = None  # sent to a worker: no more tasks


class WorkerLost(ChildProcessError):
    """A worker process ended without sending its task's result."""


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def map_shards(fn, tasks, workers, initializer=None, initargs=()):
    """Run fn over tasks in worker processes (results in completion order), or in-process for
    one worker. Only small per-shard results come back, so memory does not grow with shard
    count. The first task to raise stops the others, and its exception is raised here."""
    tasks = list(tasks)
    if workers <= 1 or len(tasks) <= 1:
        if initializer:
            initializer(*initargs)
        yield from map(fn, tasks)
        return
    # fork: workers inherit the already-imported modules (spawn would re-import them per worker)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    procs = {}  # the parent's end of each worker's pipe -> its process
    try:
        for _ in range(min(workers, len(tasks))):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(theirs, fn, initializer, initargs), daemon=True)
            proc.start()
            theirs.close()
            procs[ours] = proc
        todo = iter(tasks)
        busy = {}  # pipe -> process, for the workers with a task
        for conn, proc in procs.items():
            conn.send(next(todo))  # one each: there are at least as many tasks as workers
            busy[conn] = proc
        while busy:
            sentinels = {proc.sentinel: conn for conn, proc in busy.items()}
            # each worker once, whether its pipe (a result) or its sentinel (it ended) is ready
            for conn in dict.fromkeys(sentinels.get(r, r) for r in wait(list(busy) + list(sentinels))):
                ok, value = _receive(conn, busy[conn])
                if not ok:
                    raise value
                yield value
                task = next(todo, _STOP)
                conn.send(task)
                if task is _STOP:
                    del busy[conn]
        for proc in procs.values():
            proc.join()
    finally:  # a failed task, Ctrl-C, or the caller stopped early: the workers stop now
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
        for conn, proc in procs.items():
            proc.join()
            conn.close()


def _receive(conn, proc):
    """(ok, result or exception) from a worker, or WorkerLost if it died first."""
    try:
        return conn.recv()
    except (EOFError, ConnectionResetError):
        proc.join()
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        raise WorkerLost(f"a data worker process ended without its shard's result ({how}; "
                         "out of memory?): --workers=1 runs the shards in this process") from None


def _worker(conn, fn, initializer, initargs):
    # Ctrl-C reaches the whole process group: only the parent reacts (one line, temp folder
    # removed); workers printing their own KeyboardInterrupt tracebacks would bury it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer:
        initializer(*initargs)
    while True:
        task = conn.recv()
        if task is _STOP:
            return
        try:
            result = (True, fn(task))
        except Exception as e:  # the parent raises it
            result = (False, e)
        try:
            conn.send(result)
        except Exception as e:  # a result or exception that does not pickle
            conn.send((False, RuntimeError(f"{type(e).__name__}: {e} (sending {type(result[1]).__name__})")))
