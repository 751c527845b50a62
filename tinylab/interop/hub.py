"""The Hugging Face hub in one place: are we offline, can the hub be reached, and `load_dataset`
with one-line errors.

`datasets` retries an unreachable hub for about half a minute and logs a warning per retry before
it fails, so `load_dataset` below first makes one quick probe of the hub (HF_ENDPOINT, through the
proxy when one is configured) and fails at once, in one line, when it does not answer. With
HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set nothing is probed: `datasets` reads its local cache.

    import hub
    ds = hub.load_dataset("wikitext", "wikitext-103-raw-v1", "test", fix="pass --data=PATH")
    problem = hub.unreachable()   # None, or why the hub cannot be reached
"""
import os
import socket
import threading
from urllib.parse import urlparse

from tinylab.core.errors import UserError, first_line

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT = 3.0  # seconds: a reachable hub answers well within this
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # what datasets / huggingface_hub accept as "set"


def endpoint() -> str:
    """The hub's base URL: HF_ENDPOINT (a mirror or a local server) or huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_ENDPOINT


def offline() -> bool:
    """HF_DATASETS_OFFLINE, or else HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, is set (datasets' own
    precedence: HF_DATASETS_OFFLINE=0 means online whatever HF_HUB_OFFLINE says)."""
    value = os.environ.get("HF_DATASETS_OFFLINE")
    if value is None:
        value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return (value or "").strip().upper() in TRUE_VALUES


def proxy_for(url: str):
    """The proxy requests would use for `url` (HTTPS_PROXY / https_proxy / ALL_PROXY ..., minus
    NO_PROXY), or None."""
    import requests
    return requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))


def _probe(url, proxy, timeout):
    """None if the hub answers, else why not. Through a proxy only an HTTP request tells (the
    proxy itself is always there); without one, a TCP connection is enough and cheaper."""
    try:
        if proxy:
            import requests
            r = requests.head(url, timeout=timeout, allow_redirects=False)
            # 407: the proxy wants credentials; 502-504: the proxy could not reach the hub
            if r.status_code == 407 or r.status_code >= 500:
                return f"HTTP {r.status_code} through the proxy {proxy}"
            return None
        u = urlparse(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        socket.create_connection((u.hostname, port), timeout=timeout).close()
        return None
    except Exception as e:  # OSError, requests' exceptions, a malformed URL: all "unreachable"
        # requests' messages nest urllib3's several layers deep: its type says enough
        return f"{type(e).__name__} through the proxy {proxy}" if proxy else first_line(e)


def unreachable(timeout: float = PROBE_TIMEOUT):
    """None if the hub at endpoint() answers within `timeout`, else a one-line reason. The probe
    runs in a thread so that a slow name lookup (not covered by socket timeouts) cannot hang us."""
    url = endpoint()
    if not urlparse(url).hostname:
        return f"HF_ENDPOINT={url} is not a URL"
    proxy = proxy_for(url)
    result = []
    t = threading.Thread(target=lambda: result.append(_probe(url, proxy, timeout)), daemon=True)
    t.start()
    t.join(2 * timeout)  # connect + read (or name lookup + connect)
    return result[0] if result else f"no answer within {2 * timeout:g}s" + (f" (proxy {proxy})" if proxy else "")


def load_dataset(name, config=None, split=None, what="", fix="use a local file"):
    """datasets.load_dataset(name, config, split=split) with one-line UserErrors: no `datasets`,
    an unreachable hub (found by one quick probe instead of datasets' retries), offline and not
    cached, no such dataset / config / split. `what` names the data in messages, `fix` says what
    the user can do instead."""
    what = what or f"the Hugging Face dataset {name}{'/' + config if config else ''}"
    try:
        import datasets
    except ImportError:
        raise UserError(f"{what} needs the `datasets` package (pip install datasets); or {fix}") from None
    if offline():
        mode = "offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set) and not in the local cache"
    else:
        problem = unreachable()
        if problem:
            raise UserError(f"{what} needs the network, but the hub {endpoint()} cannot be reached ({problem}); "
                            f"{fix}, or download it where the network works (then HF_DATASETS_OFFLINE=1 "
                            f"reads the cache)")
        mode = "not loadable"
    datasets.utils.logging.set_verbosity_error()  # its download / cache log lines are not ours to print
    try:
        return datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # not cached, no such name / config / split, hub errors: all the user's to fix
        raise UserError(f"{what} is {mode} ({first_line(e)}); {fix}") from None
