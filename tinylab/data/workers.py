"""The worker pool of the data stages (synthesize, pretokenize): one task per raw shard."""
import multiprocessing
import os
import signal


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def map_shards(fn, tasks, workers, initializer=None, initargs=()):
    """Run fn over tasks in a process pool (results in completion order), or in-process for one
    worker. Only small per-shard results come back, so memory does not grow with shard count."""
    if workers <= 1 or len(tasks) <= 1:
        if initializer:
            initializer(*initargs)
        yield from map(fn, tasks)
        return
    # fork: workers inherit the already-imported modules (spawn would re-import them per worker)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(min(workers, len(tasks)), _worker_init,
                                                  (initializer, initargs)) as pool:
        yield from pool.imap_unordered(fn, tasks)  # on Ctrl-C the parent stops the pool (terminate)


def _worker_init(initializer, initargs):
    # Ctrl-C reaches the whole process group: only the parent reacts (one line, temp folder
    # removed); workers printing their own KeyboardInterrupt tracebacks would bury it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer:
        initializer(*initargs)
