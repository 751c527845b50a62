"""Readings the bench scripts share: memory (each measures in a fresh process of its own) and
whole programs run as subprocesses."""
import os
import resource
import subprocess
import time


def rss_mib():
    """This process's resident set size now, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib():
    """This process's peak resident set size so far, MiB (getrusage's ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_timed(cmd, cwd, env, log_path):
    """Run cmd to its end with its output in log_path: (wall s, CPU s of the process tree (user +
    sys), its output, its exit code). Wall time counts everything a user's `time` would:
    interpreter start, imports, the work and the exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(log_path) as f:
        return wall, cpu, f.read(), proc.returncode
