"""Progress bars for long work (tqdm)."""
from tqdm import tqdm


def progress(*args, **kwargs):
    """A tqdm bar on stderr when it is a terminal; off otherwise, so logs and error output of
    scripted runs stay clean (bad input is then exactly one line)."""
    return tqdm(*args, disable=None, **kwargs)
