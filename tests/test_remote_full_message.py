"""A local remote-cache folder that is full is named as the folder it is, not as the URL.

The review of 2026-11-24 (thirteenth session) streamed a cache from a real ``http.server``
with a ``cache_limit_bytes`` below what ``prefetch`` needs. The error said ``local cache
http://127.0.0.1:PORT/cache is full (...); raise cache_limit_bytes``: the fetcher's rewrite
of local paths into URLs (meant for the files it fetched) also rewrote the folder itself,
so the message named the server where the user must look at a local folder. Now the folder
stays a local path; the files in it still read as their URLs.
"""

from __future__ import annotations

import json

import pytest

from conftest import build_toy
from cachebuild.errors import RemoteError
from loaders import ShardStream
from loaders.remote import RemoteOptions
from remote_fixtures import serve_folder

pytestmark = pytest.mark.dist


def test_a_full_local_cache_names_its_folder(tmp_path):
    cache = tmp_path / "served" / "cache"
    build_toy(cache, records=600)
    sizes = [s["bytes"] for s in json.loads((cache / "manifest.json").read_text())["shards"]]
    assert len(sizes) >= 4
    local = tmp_path / "local"
    opts = RemoteOptions(cache_dir=str(local), cache_limit_bytes=2 * max(sizes) + 1024, prefetch=2, retries=0)
    with serve_folder(tmp_path / "served") as (base, _):
        url = f"{base}/cache"
        stream = ShardStream(url, view="records", batch_size=64, shuffle=False, remote=opts)
        with pytest.raises(RemoteError) as info:
            for _ in stream:
                pass
    message = str(info.value)
    assert f"local cache {local / 'shards'} is full" in message, message
    assert f"local cache {url}" not in message
    assert "raise cache_limit_bytes" in message and "\n" not in message


def test_a_file_larger_than_the_limit_is_still_named_by_its_url(tmp_path):
    cache = tmp_path / "served" / "cache"
    build_toy(cache, records=600)
    opts = RemoteOptions(cache_dir=str(tmp_path / "local"), cache_limit_bytes=1024, retries=0)
    with serve_folder(tmp_path / "served") as (base, _):
        stream = ShardStream(f"{base}/cache", view="records", batch_size=64, shuffle=False, remote=opts)
        with pytest.raises(RemoteError, match=rf"file {base}/cache/shard-00000\.(tar|idx\.npy) \(\d+ bytes\) is larger than the local cache limit"):
            for _ in stream:
                pass
