"""Review of remote streaming (2026-11-24): a real HTTP server on 127.0.0.1 that misbehaves
(``remote_fixtures.serve_hostile``), the local cache folder under hostile conditions, and a
DataLoader with workers meeting a failing server. Each test names the defect it guards."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachebuild.errors import ConfigError, RemoteError, ShardCorruptError
from cachebuild.format.reader import open_shard
from loader_fixtures import build_causal
from loaders import ShardStream, make_loader
from loaders.shards import RemoteFiles
from loaders.remote import LocalShardCache, RemoteOptions, ShardFetcher, fetch_manifest
from remote_fixtures import send_bytes, serve_folder, serve_hostile

TAR = "shard-00000.tar"


def _opts(tmp_path: Path, limit: int = 1 << 26, **kw) -> RemoteOptions:
    kw = {"timeout_s": 1.0, "retries": 0, "prefetch": 1, **kw}
    return RemoteOptions(cache_dir=str(tmp_path / "local"), cache_limit_bytes=limit, **kw)


def _fetch_first(url: str, opts: RemoteOptions) -> None:
    m = fetch_manifest(url, opts)
    f = ShardFetcher(url, m, opts)
    try:
        with f.open(0, lambda tar, idx: open_shard(m, m.shards[0], tar, idx)):
            pass
    finally:
        f.close()


def _one_line_remote_error(info: pytest.ExceptionInfo, url: str) -> str:
    text = str(info.value)
    assert "\n" not in text, f"not one line: {text!r}"
    assert f"{url}/{TAR}" in text
    return text


def test_more_bytes_than_the_manifest_says_never_fill_the_local_folder(toy_cache, tmp_path):
    """Was: the download loop read to the end of the body, so a server streaming an endless (or a
    larger) file wrote all of it into the local folder, far past the limit, before the size check."""
    tar = (toy_cache / TAR).read_bytes()
    limit = 4 * len(tar)
    opts = _opts(tmp_path, limit)
    folder = opts.resolved_cache_dir("x")  # (created by the fetcher; watched once it exists)
    peak = [0]
    stop = threading.Event()

    def watch(folder: Path) -> None:
        while not stop.is_set():
            if folder.is_dir():
                try:
                    peak[0] = max(peak[0], sum(p.stat().st_size for p in folder.iterdir() if p.is_file()))
                except FileNotFoundError:  # a download renamed or removed between listing and stat
                    pass
            time.sleep(0.0005)

    with serve_hostile(toy_cache, {TAR: send_bytes(tar + b"\0" * (40 << 20))}) as url:
        folder = opts.resolved_cache_dir(url)
        t = threading.Thread(target=watch, args=(folder,))
        t.start()
        try:
            with pytest.raises(RemoteError, match="more bytes than the manifest's") as info:
                _fetch_first(url, opts)
        finally:
            stop.set()
            t.join()
    _one_line_remote_error(info, url)
    assert peak[0] <= limit, f"local folder held {peak[0]} bytes > limit {limit}"
    assert not list(folder.glob(".part-*"))


def test_a_broken_status_line_is_a_remote_error_naming_the_url(toy_cache, tmp_path):
    """Was: http.client.BadStatusLine (not an OSError) escaped the retry loop as a raw traceback."""

    def garbage(h) -> None:
        h.wfile.write(b"HELLO not http\r\n\r\n")
        h.close_connection = True

    with serve_hostile(toy_cache, {TAR: garbage}) as url:
        with pytest.raises(RemoteError, match=r"after 2 attempts: HELLO not http") as info:
            _fetch_first(url, _opts(tmp_path, retries=1))
    _one_line_remote_error(info, url)


def _redirect(location: str):
    def trick(h) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return trick


def test_redirects_loops_and_file_urls_are_one_line_other_hosts_are_checked_by_sha256(toy_cache, tmp_path):
    """Was: urllib's redirect-loop reason spans three lines, and went into the error as is.
    Held: a redirect to file:// is refused; one to another host or port is followed (CDNs, presigned
    object URLs), and what it serves is still checked against the manifest's sha256."""
    with serve_hostile(toy_cache, {TAR: _redirect(f"/{TAR}")}) as url:
        with pytest.raises(RemoteError, match="infinite loop") as info:
            _fetch_first(url, _opts(tmp_path / "a"))
        _one_line_remote_error(info, url)
    with serve_hostile(toy_cache, {TAR: _redirect("file:///etc/passwd")}) as url:
        with pytest.raises(RemoteError, match="not allowed") as info:
            _fetch_first(url, _opts(tmp_path / "b"))
        _one_line_remote_error(info, url)
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / TAR).write_bytes((toy_cache / TAR).read_bytes()[::-1])
    with serve_folder(toy_cache) as (other, _), serve_folder(tmp_path / "wrong") as (wrong, _):
        with serve_hostile(toy_cache, {TAR: _redirect(f"{other}/{TAR}")}) as url:
            _fetch_first(url, _opts(tmp_path / "c"))  # the same bytes elsewhere: fine
        with serve_hostile(toy_cache, {TAR: _redirect(f"{wrong}/{TAR}")}) as url:
            with pytest.raises(ShardCorruptError, match="sha256") as info:
                _fetch_first(url, _opts(tmp_path / "d"))
            _one_line_remote_error(info, url)


@pytest.mark.parametrize("name", [TAR, "manifest.json"])
def test_a_trickling_server_is_a_stall_within_the_timeout(toy_cache, tmp_path, name):
    """Was: the timeout applied to each socket read, so a server sending a byte now and then
    (never silent for timeout_s) held the trainer (or the stream's construction) as long as it liked."""
    tar = (toy_cache / name).read_bytes()

    def trickle(h) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(tar)))
        h.end_headers()
        end = time.monotonic() + 6
        for i in range(len(tar)):
            if time.monotonic() > end:
                return
            h.wfile.write(tar[i : i + 1])
            h.wfile.flush()
            time.sleep(0.02)

    with serve_hostile(toy_cache, {name: trickle}) as url:
        t = time.monotonic()
        with pytest.raises(RemoteError, match=rf"^cannot fetch {re.escape(url)}/{name} after 1 attempts: stalled: under 1048576 bytes in 0\.3 s"):
            _fetch_first(url, _opts(tmp_path, timeout_s=0.3))
        elapsed = time.monotonic() - t
    assert elapsed < 3, f"a trickling server held the fetch {elapsed:.1f} s"


def test_a_compressing_server_is_named_in_the_error(toy_cache, tmp_path):
    """Was: a body sent gzip'd (Content-Encoding) failed as 'connection cut?'."""
    body = gzip.compress((toy_cache / TAR).read_bytes())
    with serve_hostile(toy_cache, {TAR: send_bytes(body, headers={"Content-Encoding": "gzip"})}) as url:
        with pytest.raises(RemoteError, match="Content-Encoding gzip") as info:
            _fetch_first(url, _opts(tmp_path))
    _one_line_remote_error(info, url)


def test_a_download_killed_mid_way_does_not_hold_the_folder_for_ever(toy_cache, tmp_path):
    """Was: a process killed while downloading (OOM killer, SIGKILL of a worker) left its
    ``.part-<size>-<pid>-...`` reservation, counted against the limit by every later process:
    the folder stayed 'full' until someone deleted it by hand."""
    limit = 4 * (toy_cache / TAR).stat().st_size
    opts = _opts(tmp_path, limit)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with serve_folder(toy_cache) as (url, _):
        folder = opts.resolved_cache_dir(url)
        folder.mkdir(parents=True)
        left = folder / f".part-{limit}-{dead.pid}-1-0123456789abcdef-{TAR}"
        left.write_bytes(b"\0" * 1000)
        alive = folder / f".part-1-{os.getpid()}-1-0123456789abcdef-other.tar"  # a live download: kept
        alive.touch()
        _fetch_first(url, opts)
    assert not left.exists() and alive.exists()


def test_default_local_folder_is_per_user_and_a_folder_of_another_user_is_refused(tmp_path):
    """Was: one ``/dev/shm/cachebuild-remote`` for every user of a node: the second user's loader
    died with a raw PermissionError, and a folder planted by another user (files named like checked
    downloads) was trusted."""
    assert f"cachebuild-remote-{os.getuid()}" in str(RemoteOptions().resolved_cache_dir("http://h/c"))
    folder = tmp_path / "theirs"
    folder.mkdir()
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    os.chown(folder, 65534, 65534)
    with pytest.raises(RemoteError, match=rf"local cache folder {re.escape(str(folder))}: owned by uid 65534"):
        LocalShardCache(folder, 1 << 20)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RemoteError, match="cannot create it"):
        LocalShardCache(tmp_path / "file" / "sub", 1 << 20)


@pytest.fixture(scope="module")
def small_causal(tmp_path_factory) -> Path:
    return build_causal(tmp_path_factory.mktemp("rv") / "cache", graphs=120, shard_mb=0.25)


@pytest.mark.timeout(60)
def test_server_error_mid_epoch_reaches_the_trainer_as_one_line_with_two_workers(small_causal, tmp_path):
    """Held: an HTTP 500 for one shard mid-epoch, with two DataLoader workers, is one RemoteError
    line in the trainer naming the URL, and the loader shuts down without hanging."""
    tricks: dict = {}
    with serve_hostile(small_causal, tricks) as url:
        stream = ShardStream(url, view="graphs", batch_size=8, seed=1, remote=_opts(tmp_path, timeout_s=0.5, retries=1))
        loader = make_loader(stream, num_workers=2, prefetch_factor=1)
        it = iter(loader)
        next(it)
        names = sorted(p.name for p in small_causal.glob("shard-*.tar"))
        for name in names:
            tricks[name] = send_bytes(b"boom", status=500)
        t = time.monotonic()
        with pytest.raises(RemoteError, match=re.escape(url) + r"/shard-\d+\.tar: HTTP 500") as info:
            for _ in it:
                pass
        del it, loader
        elapsed = time.monotonic() - t
    assert "\n" not in str(info.value)
    assert elapsed < 20


def test_one_local_folder_one_limit_whatever_the_urls(toy_cache, tmp_path):
    """Was: each URL had its own subfolder of ``cache_dir`` with the whole limit, so a mixture of
    remote caches (or one cache under two URLs, or with and without a trailing slash once the
    hash differed) held N x the limit in the folder the user bounded, and fetched the same files twice."""
    total = sum(p.stat().st_size for p in toy_cache.glob("shard-*") if not p.name.endswith(".json"))
    limit = total // 2 + 1
    assert limit >= 2 * max(p.stat().st_size for p in toy_cache.glob("shard-*.tar"))
    opts = _opts(tmp_path, limit)
    with serve_folder(toy_cache) as (a, _), serve_folder(toy_cache) as (b, _):
        for url in (a, b + "/"):
            m = fetch_manifest(url, opts)
            f = ShardFetcher(url, m, opts)
            for i, e in enumerate(m.shards):
                with f.open(i, lambda tar, idx, e=e: open_shard(m, e, tar, idx)):
                    pass
            f.close()
    on_disk = sum(p.stat().st_size for p in (tmp_path / "local").rglob("*") if p.is_file())
    assert on_disk <= limit, f"{on_disk} bytes under cache_dir > limit {limit}"


def test_the_same_cache_under_two_urls_is_fetched_once(toy_cache, tmp_path):
    """The local copies are named by content: a second URL of the same cache reads them."""
    opts = _opts(tmp_path)
    second: list[str] = []
    with serve_folder(toy_cache) as (a, _), serve_folder(toy_cache, second) as (b, _):
        _fetch_first(a, opts)
        _fetch_first(b + "/", opts)
    assert second == ["/manifest.json"]


def test_a_shard_larger_than_the_limit_names_its_url_and_writes_nothing(toy_cache, tmp_path):
    """Was: the error named the file by its local name (``<sha256 prefix>-shard-00000.tar``), not its URL,
    and, being an OSError, was retried with backoff like a network fault and wrapped in "cannot fetch ... after N attempts".
    Held: a declared size above the limit (a huge one included) is refused before any byte is fetched."""
    manifest = json.loads((toy_cache / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = 1 << 43  # 8 TiB (the manifest check allows up to 16)
    tricks = {"manifest.json": send_bytes(json.dumps(manifest).encode())}
    for limit, tricked in ((1000 + (toy_cache / "shard-00000.idx.npy").stat().st_size, {}), (1 << 30, tricks)):
        opts = _opts(tmp_path / str(limit), limit)
        with serve_hostile(toy_cache, tricked) as url:
            m = fetch_manifest(url, opts)
            files = RemoteFiles(url, m, opts)
            with pytest.raises(RemoteError, match=rf"^file {re.escape(url)}/{TAR} \(\d+ bytes\) is larger than the local cache limit") as info:
                files.open(0, lambda tar, idx: open_shard(m, m.shards[0], tar, idx))
            files.close()
        assert "\n" not in str(info.value)
        assert not [p for p in opts.resolved_cache_dir().iterdir() if p.name.endswith(".tar") or p.name.startswith(".part-")]


def test_a_cache_rebuilt_at_its_url_since_the_manifest_was_read_says_so(toy_cache, tmp_path):
    """Was: '(corrupt at the source?)', when the likely cause is a cache rebuilt between the manifest and the fetch."""
    served = tmp_path / "served"
    shutil.copytree(toy_cache, served)
    with serve_folder(served) as (url, _):
        opts = _opts(tmp_path)
        m = fetch_manifest(url, opts)
        (served / TAR).write_bytes((toy_cache / TAR).read_bytes()[::-1])  # rebuilt: same name and size, other bytes
        with pytest.raises(ShardCorruptError, match=rf"^{re.escape(url)}/{TAR}: sha256 .* changed since its manifest was read"):
            f = ShardFetcher(url, m, opts)
            f.get(0)
        f.close()


@pytest.mark.parametrize("suffix", ["?token=abc", "#part", "/?x"])
def test_a_cache_url_with_a_query_or_fragment_is_refused(tmp_path, suffix):
    """Was: ``<URL>/manifest.json`` put the name inside the query (``/cache?token=abc/manifest.json``):
    the server answered for another resource and the error said 'not valid JSON'."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "index.html").write_text("<html></html>")
    with serve_folder(tmp_path) as (url, _):
        with pytest.raises(ConfigError, match=r"without \?query or #fragment"):
            fetch_manifest(f"{url}/cache{suffix}", _opts(tmp_path))


def test_malformed_urls_and_unknown_protocols_are_one_line_remote_errors(tmp_path):
    """Was: raw ValueError tracebacks (fsspec's 'Protocol not known', urllib's 'Invalid IPv6 URL')."""
    with pytest.raises(RemoteError, match=r"^cannot fetch htp://x/c/manifest\.json: Protocol not known: htp$"):
        fetch_manifest("htp://x/c", _opts(tmp_path))
    with pytest.raises(ConfigError, match="Invalid IPv6 URL"):
        fetch_manifest("http://[::1/c", _opts(tmp_path))


def test_a_cache_under_a_path_with_spaces_and_accents_is_read(toy_cache, tmp_path):
    """Was: a space was refused by http.client ('URL can't contain control characters') and a non-ASCII
    letter raised a raw UnicodeEncodeError; they are %-escaped as a browser does."""
    shutil.copytree(toy_cache, tmp_path / "srv" / "my caché")
    with serve_folder(tmp_path / "srv") as (url, _):
        _fetch_first(f"{url}/my caché", _opts(tmp_path))
        _fetch_first(f"{url}/my%20cach%C3%A9", _opts(tmp_path / "b"))  # already escaped: unchanged


@pytest.mark.parametrize(("key", "value"), [("retries", -1), ("timeout_s", 0), ("cache_limit_bytes", 0), ("prefetch", -1), ("retries", 1.5)])
def test_remote_options_are_checked_where_they_enter(key, value):
    """Was: not checked: retries=-1 made every fetch end in AssertionError('unreachable'), timeout_s=0 a
    non-blocking socket's 'Resource temporarily unavailable', a zero limit 'larger than the limit' per file."""
    with pytest.raises(ConfigError, match=rf"RemoteOptions\.{key}' has invalid value {value!r}"):
        RemoteOptions(**{key: value})


def test_links_planted_in_the_local_folder_are_neither_trusted_nor_written_through(toy_cache, tmp_path):
    """Was: a link at a checked file's local name was served without a request (lookup followed it),
    and a link at a download's temp name or at ``.lock`` had the download or the lock file written
    outside the folder (``touch`` / ``open(.., 'wb')`` / ``open(.., 'a+')`` followed them)."""
    opts = _opts(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    requests: list[str] = []
    with serve_folder(toy_cache, requests) as (url, _):
        m = fetch_manifest(url, opts)
        f = ShardFetcher(url, m, opts)
        folder = f.cache.folder
        e = m.shards[0]
        local = f.local_name(e.name, e.sha256)
        shutil.copy(toy_cache / TAR, outside / "copy.tar")  # right size and content, but a link: not ours
        (folder / local).symlink_to(outside / "copy.tar")
        tmp = folder / f".part-{e.bytes}-{os.getpid()}-{threading.get_ident()}-{local}"
        (outside / "victim").write_text("precious")
        tmp.symlink_to(outside / "victim")
        (folder / ".lock").unlink(missing_ok=True)
        (folder / ".lock").symlink_to(outside / "lock-target")
        with pytest.raises(RemoteError, match=r"Too many levels of symbolic links: .*\.lock"):  # refused, never created outside
            f._download(e.name, e.bytes, e.sha256, set())
        (folder / ".lock").unlink()
        got = f._download(e.name, e.bytes, e.sha256, set())  # in this thread: the temp name above
        f.close()
    assert requests.count(f"/{TAR}") == 1, "the planted link was served as a checked download"
    assert got == folder / local and not got.is_symlink() and got.read_bytes() == (toy_cache / TAR).read_bytes()
    assert (outside / "victim").read_text() == "precious"
    assert sorted(p.name for p in outside.iterdir()) == ["copy.tar", "victim"]


def test_a_full_local_folder_is_waited_for_while_other_downloads_finish(toy_cache, tmp_path):
    """A 'full' folder (others' downloads in flight hold its room) is retried with backoff, like a
    network fault: the room comes back when they finish. (Guards a regression of this review.)"""
    limit = 4 * (toy_cache / TAR).stat().st_size
    opts = _opts(tmp_path, limit, retries=3)
    with serve_folder(toy_cache) as (url, _):
        folder = opts.resolved_cache_dir(url)
        folder.mkdir(parents=True)
        other = folder / f".part-{limit}-{os.getpid()}-1-0123456789abcdef-other.tar"  # a live download's reservation
        other.touch()
        threading.Timer(0.1, other.unlink).start()
        _fetch_first(url, opts)


_EXIT_CHILD = """
import os, sys, threading, time
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from loaders import ShardStream
from loaders.remote import RemoteOptions
from remote_fixtures import serve_hostile

root, local = Path(sys.argv[1]), sys.argv[2]
stalled = threading.Event()

def stall(h):
    if not stalled.is_set():
        return SimpleHTTPRequestHandler.do_GET(h)
    time.sleep(60)

with serve_hostile(root, {p.name: stall for p in root.glob("shard-*.tar")}) as url:
    opts = RemoteOptions(cache_dir=local, timeout_s=4.0, retries=2, prefetch=2)
    it = iter(ShardStream(url, view="graphs", batch_size=8, seed=1, remote=opts))
    next(it)
    stalled.set()  # the server stops answering: the next prefetches hang until their timeouts
    threading.Thread(target=lambda: [None for _ in it], daemon=True).start()  # the trainer, interrupted
    time.sleep(0.5)
    print(time.time(), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # (the interrupted thread's error at exit is not the point)
"""


@pytest.mark.timeout(60)
def test_a_process_exits_at_once_while_downloads_stall(small_causal, tmp_path):
    """Was: the fetch threads were a ThreadPoolExecutor's, which the interpreter joins at exit and
    whose queued downloads it runs: a trainer stopping (Ctrl-C, its own error) while the server stalled
    waited for its queued prefetches to time out (about 10 s with timeout_s=3, retries=1 in a probe; minutes at the default timeout and retries)."""
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tests).parent), tests])}
    proc = subprocess.run([sys.executable, "-c", _EXIT_CHILD, str(small_causal), str(tmp_path / "local")], capture_output=True, text=True, env=env, timeout=50)
    end = time.time()
    assert proc.returncode == 0, proc.stderr[-2000:]
    delay = end - float(proc.stdout.split()[-1])
    assert delay < 3.0, f"the process took {delay:.1f} s to exit after its last line"
