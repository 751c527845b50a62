"""Memory readings the bench scripts share (each measures in a fresh process of its own)."""
import os
import resource


def rss_mib():
    """This process's resident set size now, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib():
    """This process's peak resident set size so far, MiB (getrusage's ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
