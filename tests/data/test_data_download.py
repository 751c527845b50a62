"""download against a local HTTP server on 127.0.0.1 (no internet): streaming, HTTP Range resume
after an interrupted transfer, size check, safe unpacking, idempotence."""
import io
import json
import os
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import assert_one_line_error, run_main

from tinylab.core.errors import UserError
from tinylab.data.download import download

SHARDS = {"data00.json": [{"story": "A cat sat.", "summary": "cat", "source": "GPT-4",
                           "instruction": {"prompt:": "p", "words": ["sit", "cat", "big"], "features": []}}],
          "data01.json": [{"story": "A dog ran.", "summary": "dog", "source": "GPT-4",
                           "instruction": {"prompt:": "p", "words": ["run", "dog", "fast"], "features": ["Twist"]}}]}


def make_tar(members):
    """A tar.gz (bytes) of {name: bytes}; sizable, incompressible padding makes resume meaningful."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


GOOD_TAR = make_tar({**{k: json.dumps(v).encode() for k, v in SHARDS.items()}, "padding.bin": os.urandom(200_000)})


class Server:
    """Serves `body` at /archive.tar.gz with Range support; can cut the first response short."""

    def __init__(self, body, cut_first_at=None, status=200):
        self.body, self.cut, self.status, self.requests = body, cut_first_at, status, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.headers.get("Range"))
                if server.status != 200:
                    self.send_error(server.status)
                    return
                body, start = server.body, 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:]
                if server.cut is not None:  # announce everything, send a part, hang up
                    payload, server.cut = payload[:server.cut], None
                    self.close_connection = True
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/archive.tar.gz"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(*args, **kwargs):
        servers.append(Server(*args, **kwargs))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def shards_in(cache):
    raw = os.path.join(cache, "TinyStories_all_data")
    return {f: json.load(open(os.path.join(raw, f))) for f in sorted(os.listdir(raw)) if f.endswith(".json")}


def test_download_unpack_and_idempotent_via_cli(serve, tmp_path):
    server = serve(GOOD_TAR)
    proc = run_main("tinystories.py", ["download", f"--data_cache_dir={tmp_path}", f"--data_url={server.url}"])
    assert proc.returncode == 0, proc.stderr
    assert shards_in(tmp_path) == SHARDS
    assert open(tmp_path / "TinyStories_all_data.tar.gz", "rb").read() == GOOD_TAR
    assert server.requests == [None]
    proc = run_main("tinystories.py", ["download", f"--data_cache_dir={tmp_path}", f"--data_url={server.url}"])
    assert proc.returncode == 0 and "nothing to do" in proc.stdout
    assert server.requests == [None]  # idempotent: no second request
    assert sorted(os.listdir(tmp_path)) == ["TinyStories_all_data", "TinyStories_all_data.tar.gz"]


def test_interrupted_download_resumes_with_range(serve, tmp_path):
    server = serve(GOOD_TAR, cut_first_at=70_000)
    with pytest.raises(UserError, match="interrupted after .* bytes.*run the same command again"):
        download(str(tmp_path), server.url, timeout=10)
    have = os.path.getsize(tmp_path / "TinyStories_all_data.tar.gz.part")
    assert 0 < have <= 70_000  # what arrived in whole blocks is kept
    assert not os.path.exists(tmp_path / "TinyStories_all_data")
    download(str(tmp_path), server.url, timeout=10)
    assert server.requests == [None, f"bytes={have}-"]
    assert open(tmp_path / "TinyStories_all_data.tar.gz", "rb").read() == GOOD_TAR
    assert shards_in(tmp_path) == SHARDS
    assert not os.path.exists(tmp_path / "TinyStories_all_data.tar.gz.part")


def test_existing_archive_is_only_unpacked(serve, tmp_path):
    (tmp_path / "TinyStories_all_data.tar.gz").write_bytes(GOOD_TAR)
    server = serve(GOOD_TAR)
    download(str(tmp_path), server.url)
    assert server.requests == [] and shards_in(tmp_path) == SHARDS


@pytest.mark.parametrize("member", ["../evil.json", "/tmp/evil.json", "sub/../../evil.json"])
def test_unsafe_archive_is_refused(serve, tmp_path, member):
    bad = make_tar({"data00.json": b"[]", member: b"[]"})
    server = serve(bad)
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="unsafe path"):
        download(str(cache), server.url)
    assert not os.path.exists(tmp_path / "evil.json") and not os.path.exists(cache / "TinyStories_all_data")
    assert sorted(os.listdir(cache)) == ["TinyStories_all_data.tar.gz"]  # no temp folder left


def test_symlink_member_is_refused(serve, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("data00.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    server = serve(buf.getvalue())
    with pytest.raises(UserError, match="link or device"):
        download(str(tmp_path), server.url)


def test_http_error_and_corrupt_archive(serve, tmp_path):
    server = serve(b"", status=404)
    proc = run_main("tinystories.py", ["download", f"--data_cache_dir={tmp_path / 'a'}", f"--data_url={server.url}"])
    assert_one_line_error(proc, "HTTP 404")
    server = serve(b"this is not a tarball" * 100)
    with pytest.raises(UserError, match="not a readable tar.gz.*delete it"):
        download(str(tmp_path / "b"), server.url)
    assert not os.path.exists(tmp_path / "b" / "TinyStories_all_data")
