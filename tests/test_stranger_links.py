"""A stranger's cache folder whose manifest or shard is not a plain file inside it (acceptance audit
of issue 10): a manifest linked out of the cache, to ``/dev/zero`` or a FIFO, and a shard that is a
link to itself. Every entry point refuses it in one line with a non-zero exit, without reading
outside the cache or blocking, and ``stage`` leaves its destination uncreated."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import build_toy
from cachebuild.errors import CacheBuildError
from cachebuild.format.generations import read_generation, snapshot_path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}

LOADER = """
import sys
from loaders import ShardStream, make_loader
from loaders.loader import shutdown_workers
from cachebuild.errors import CacheBuildError
try:
    dl = make_loader(ShardStream(sys.argv[1], view="records", batch_size=64, shuffle=False), num_workers=int(sys.argv[2]))
    try:
        for _ in dl:
            pass
    finally:
        shutdown_workers(dl)
except CacheBuildError as exc:
    print("error:", exc, file=sys.stderr)
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("links") / "good"
    build_toy(root, records=120)
    return root


def _manifest_linked_outside(root: Path, outside: Path) -> None:
    shutil.copy(root / "manifest.json", outside / "manifest.json")  # the same manifest, so only the link can be refused
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to(outside / "manifest.json")


def _manifest_linked_to_dev_zero(root: Path, outside: Path) -> None:
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to("/dev/zero")


def _manifest_fifo(root: Path, outside: Path) -> None:
    (root / "manifest.json").unlink()
    os.mkfifo(root / "manifest.json")  # nobody writes it: an open() for reading blocks for ever


def _shard_link_loop(root: Path, outside: Path) -> None:
    (root / "shard-00000.tar").unlink()
    (root / "shard-00000.tar").symlink_to("shard-00000.tar")


def _manifest_sparse_30_gib(root: Path, outside: Path) -> None:
    os.truncate(root / "manifest.json", 30 << 30)  # a sparse file: no disk used, 30 GiB to read


CASES = [
    ("manifest-link-outside", _manifest_linked_outside, r"manifest\.json is a symbolic link to .*outside/manifest\.json, outside the cache"),
    ("manifest-link-dev-zero", _manifest_linked_to_dev_zero, r"manifest\.json is a symbolic link to /dev/zero, outside the cache"),
    ("manifest-fifo", _manifest_fifo, r"manifest\.json is not a regular file \(a FIFO, device or folder\)"),
    ("shard-link-loop", _shard_link_loop, r"shard-00000\.tar cannot be read \(a symbolic link loop\)"),
]

BUILDER_CASES = [*CASES[:3], ("manifest-sparse-30-gib", _manifest_sparse_30_gib, r"manifest\.json: JSON of 268435457 bytes exceeds the limit")]

COMMANDS = {
    "verify": lambda root, dst: [sys.executable, "-m", "cachebuild", "verify", str(root)],
    "inspect": lambda root, dst: [sys.executable, "-m", "cachebuild", "inspect", str(root)],
    "stage": lambda root, dst: [sys.executable, "-m", "cachebuild", "stage", str(root), str(dst)],
    "loader0": lambda root, dst: [sys.executable, "-c", LOADER, str(root), "0"],
    "loader2": lambda root, dst: [sys.executable, "-c", LOADER, str(root), "2"],
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case,edit,pattern", CASES, ids=[c[0] for c in CASES])
def test_a_manifest_or_shard_that_is_no_plain_file_of_the_cache_is_one_line_everywhere(tmp_path: Path, good: Path, case, edit, pattern) -> None:
    import re

    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "cache"
    shutil.copytree(good, root)
    edit(root, outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    for name, argv in COMMANDS.items():
        dst = tmp_path / "staged"
        try:  # (was: the FIFO blocked every command; the loop was a RuntimeError/OSError traceback; the links read outside)
            proc = subprocess.run(argv(root, dst), capture_output=True, text=True, env=ENV, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: blocked for 60 s")
        lines = [ln for ln in proc.stderr.strip().splitlines() if "shards/s]" not in ln]  # (verify's progress bar)
        assert proc.returncode != 0, f"{name}: exit 0 on a hostile cache: {proc.stdout}"
        assert "Traceback" not in proc.stderr and lines[-1].startswith("error:"), f"{name}: {proc.stderr}"
        assert any(re.search(pattern, ln) for ln in lines), f"{name}: {proc.stderr}"  # (verify: its FAULT line names it)
        assert not dst.exists(), f"{name}: the stage destination was created"
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_a_generation_snapshot_linked_out_of_the_cache_is_refused(tmp_path: Path, good: Path) -> None:
    """A grown cache's older generation is read from ``generations/gen-NNNNN.json`` (a resumed loader
    state, ``--keep``): a link there leading out of the cache is refused like the manifest's."""
    root, outside = tmp_path / "cache", tmp_path / "outside.json"
    shutil.copytree(good, root)
    snap = snapshot_path(root, 7)
    snap.parent.mkdir(exist_ok=True)
    shutil.copy(root / "manifest.json", outside)
    snap.symlink_to(outside)
    with pytest.raises(CacheBuildError, match=r"gen-00007\.json is a symbolic link to .*outside\.json, outside the cache"):
        read_generation(root, 7)  # was: read, then refused only for holding generation 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,edit,pattern", BUILDER_CASES, ids=[c[0] for c in BUILDER_CASES])
@pytest.mark.parametrize("append", [False, True], ids=["rerun", "append"])
def test_a_rerun_or_append_onto_such_a_manifest_is_one_line_and_changes_nothing(tmp_path: Path, good: Path, case, edit, pattern, append: bool) -> None:
    """The builder reads the output's manifest by its own path (``LocalOutput.read_bytes``, ``markers.read_json``):
    it blocked on the FIFO, and read ``/dev/zero`` or the 30 GiB file whole (``MemoryError`` after eating the machine's RAM)."""
    import threading

    from cachebuild import build

    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "cache"
    shutil.copytree(good, root)
    edit(root, outside)
    before = sorted((p.name, p.is_symlink()) for p in root.iterdir())
    kw = dict(records=40, seed=5, append=True) if append else dict(records=120)
    result: dict[str, BaseException] = {}

    def run() -> None:
        from cachebuild.testing import ToySource

        try:
            build(ToySource(), root, shard_mb=0.02, progress=False, workers=1, **kw)
        except BaseException as exc:  # noqa: BLE001 (carried to the test)
            result["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # (was: the rerun blocked for ever opening the FIFO)
        with open(root / "manifest.json", "wb"):  # unblock the thread's open()
            pass
        pytest.fail("the build blocked on the manifest for 60 s")
    assert isinstance(result.get("exc"), CacheBuildError), result
    import re

    assert re.search(pattern, str(result["exc"])) and "\n" not in str(result["exc"]), str(result["exc"])
    assert sorted((p.name, p.is_symlink()) for p in root.iterdir() if p.name != ".cachebuild-build.lock") == before


def test_a_build_lock_hard_linked_to_a_users_file_is_refused_not_written(tmp_path: Path, good: Path) -> None:
    """``O_NOFOLLOW`` stops a symbolic link at the lock's name, not a hard link: the holder record
    (pid, host) was written over the linked file."""
    from cachebuild.builder.lock import LOCK_NAME
    from cachebuild.builder.prune import prune_cache
    from cachebuild.errors import OutputError

    root, victim = tmp_path / "cache", tmp_path / "victim.txt"
    shutil.copytree(good, root)
    victim.write_text("the user's own file")
    os.link(victim, root / LOCK_NAME)
    with pytest.raises(OutputError, match=r"\.cachebuild-build\.lock is a hard link to another file"):
        prune_cache(root)  # was: the victim truncated and overwritten with the holder's pid and host
    assert victim.read_text() == "the user's own file"


@pytest.mark.parametrize("view", ["twins", "mel", "graphs"])
def test_a_cache_without_a_views_fields_is_a_cachebuild_error(good: Path, view: str) -> None:
    """A stranger's cache of another kind opened with the view a trainer expects: one line naming the
    missing fields, as a :class:`ConfigError` (still a ``ValueError``) the CLI and trainers catch with ours."""
    from cachebuild.errors import ConfigError
    from loaders import ShardStream

    with pytest.raises(ConfigError, match=rf"view '{view}' needs field\(s\) \[.*\] that cache .*good \(kind 'toy'\) lacks; it has \['ident', 'json', 'mat', 'vec'\]"):
        ShardStream(good, view=view, batch_size=8)  # was: a builtin ValueError
