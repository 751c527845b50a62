"""tinylab/data/workers.py, the worker processes of synthesize and pretokenize: every task's
result comes back once, the initializer runs in every worker, the first failing task's exception
is raised in the parent, a worker that dies is reported at once, and whenever the parent stops
(a failure, the caller stopping early) no worker is left behind and nothing hangs."""
import multiprocessing
import os
import signal
import time

import pytest

from tinylab.core.errors import UserError
from tinylab.data.workers import WorkerLost, map_shards

_STATE = {}


def _init(offset):
    _STATE["offset"] = offset


def _add_offset(x):
    return x + _STATE.get("offset", 0), os.getpid()


def _fail_on_three(x):
    if x == 3:
        raise UserError(f"shard {x} is broken")
    time.sleep(0.01)
    return x


def _die_on_two(x):
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _big_result_or_fail(x):
    if x % 8 == 0:
        raise UserError(f"task {x} fails")
    return bytes(1 << 20)  # 1 MiB: a worker is often in the middle of sending when the others stop


@pytest.fixture
def deadline():
    """A hang fails the test instead of stopping the suite."""
    def timeout(*_):
        raise TimeoutError("map_shards did not return within 60 s")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def no_children_left():
    return multiprocessing.active_children() == []


def test_every_result_once_and_the_initializer_in_every_worker(deadline):
    results = list(map_shards(_add_offset, list(range(9)), 3, _init, (100,)))
    assert sorted(r for r, _ in results) == list(range(100, 109))
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 3
    assert no_children_left()


def test_one_worker_runs_in_this_process():
    assert [r for r, pid in map_shards(_add_offset, [1, 2], 1, _init, (10,)) if pid == os.getpid()] == [11, 12]
    _STATE.clear()


def test_a_failing_task_raises_its_exception_here(deadline):
    with pytest.raises(UserError, match="shard 3 is broken"):
        list(map_shards(_fail_on_three, list(range(12)), 3))
    assert no_children_left()


def test_a_dying_worker_is_reported_not_waited_for(deadline):
    with pytest.raises(WorkerLost, match="killed by signal 9.*--workers=1"):
        list(map_shards(_die_on_two, list(range(6)), 2))
    assert no_children_left()


def test_stopping_early_stops_the_workers(deadline):
    results = map_shards(_add_offset, list(range(20)), 2)
    next(results)
    results.close()  # the caller stopped (an exception of its own, a break)
    assert no_children_left()


def test_failures_while_others_send_never_hang(deadline):
    """Workers killed in the middle of sending a result share no lock with the others."""
    for _ in range(10):
        with pytest.raises(UserError, match="fails"):
            list(map_shards(_big_result_or_fail, list(range(1, 17)), 4))
        assert no_children_left()
