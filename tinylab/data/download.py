"""`tinystories.py download`: fetch the TinyStories archive (resuming an interrupted download)
and unpack its raw shards into <data_cache_dir>/TinyStories_all_data/. Each step is skipped when
its result exists; the folder appears only when complete (unpacked in a temp folder, renamed)."""
import glob
import os
import shutil
import tarfile
import tempfile

from tinylab.core.errors import UserError
from tinylab.core.fileio import umask
from tinylab.core.progress import progress
from tinylab.data.records import raw_data_dir

DATA_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories_all_data.tar.gz"
ARCHIVE_NAME = "TinyStories_all_data.tar.gz"


def _fetch(url: str, archive: str, timeout: float):
    """Stream `url` to `archive`, resuming a previous `.part` with an HTTP Range request."""
    import requests  # only this stage needs it

    part = archive + ".part"
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"Accept-Encoding": "identity"}  # the bytes on disk must be the archive itself
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        with requests.get(url, stream=True, headers=headers, timeout=timeout) as r:
            if r.status_code == 416 and have:  # nothing left to fetch: the part is complete
                total = int(r.headers.get("Content-Range", "*/-1").split("/")[-1])
                if total == have:
                    os.replace(part, archive)
                    return
                os.remove(part)
                raise UserError(f"server refused to resume {part}; it was deleted, run the same command again")
            if r.status_code == 206:
                total = int(r.headers["Content-Range"].split("/")[-1])
                mode = "ab"
                print(f"resuming {archive} at {have} of {total} bytes")
            elif r.status_code == 200:  # no resume support (or a fresh start): from the beginning
                have, mode = 0, "wb"
                # without a Content-Length (chunked transfer) the size cannot be checked here: a cut
                # chunked stream raises in iter_content, and gzip's CRC catches the rest on unpacking
                total = int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
            else:
                raise UserError(f"download of {url} failed: HTTP {r.status_code} {r.reason}")
            with open(part, mode) as f, progress(total=total, initial=have, unit="B", unit_scale=True,
                                              unit_divisor=1024, desc=os.path.basename(archive)) as bar:
                # small blocks: an interrupted read loses at most one block of progress
                for block in r.iter_content(chunk_size=1 << 16):
                    f.write(block)
                    bar.update(len(block))
    except requests.RequestException as e:
        size = os.path.getsize(part) if os.path.exists(part) else 0
        raise UserError(f"download of {url} interrupted after {size} bytes ({type(e).__name__}); "
                        f"run the same command again to resume") from None
    size = os.path.getsize(part)
    if total is not None and size != total:
        raise UserError(f"downloaded {size} bytes of {archive} but the server announced {total}; "
                        f"run the same command again to resume")
    os.replace(part, archive)


def _extract(archive: str, target: str):
    """Unpack into a temp folder, refusing members that are not plain files/folders inside it,
    then rename the folder holding the .json shards to `target`."""
    parent = os.path.dirname(os.path.abspath(target))
    tmp = tempfile.mkdtemp(prefix=".tmp_extract_", dir=parent)
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                for member in progress(tar, desc=f"unpacking {os.path.basename(archive)}", unit=" files"):
                    name = os.path.normpath(member.name)
                    if os.path.isabs(name) or name == ".." or name.startswith(".." + os.sep):
                        raise UserError(f"unsafe path '{member.name}' in {archive}: refusing to unpack it")
                    if not (member.isfile() or member.isdir()):
                        raise UserError(f"unsafe member '{member.name}' (link or device) in {archive}: "
                                        f"refusing to unpack it")
                    tar.extract(member, tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            reason = " ".join(str(e).split())
            raise UserError(f"{archive} is not a readable tar.gz ({reason}); delete it and run download again") from None
        folders = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(tmp, "**", "*.json"), recursive=True)})
        if len(folders) != 1:
            raise UserError(f"{archive} should hold one folder of .json shards, found {len(folders)}")
        os.chmod(folders[0], 0o777 & ~umask())
        os.rename(folders[0], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(data_cache_dir: str, data_url: str = DATA_URL, timeout: float = 60):
    """Download and unpack TinyStories; each step is skipped when its result exists."""
    raw = raw_data_dir(data_cache_dir)
    if glob.glob(os.path.join(raw, "*.json")):
        print(f"{raw} already has the raw shards, nothing to do")
        return raw
    os.makedirs(data_cache_dir, exist_ok=True)
    archive = os.path.join(data_cache_dir, ARCHIVE_NAME)
    if os.path.exists(archive):
        print(f"{archive} already downloaded")
    else:
        print(f"downloading {data_url} to {archive}")
        _fetch(data_url, archive, timeout)
    if os.path.exists(raw):  # an empty or foreign folder would block the rename
        raise UserError(f"{raw} exists but holds no .json shards; remove it and run download again")
    _extract(archive, raw)
    shards = sorted(glob.glob(os.path.join(raw, "*.json")))
    print(f"unpacked {len(shards)} shards into {raw}")
    return raw
