"""The loader as a new user meets it: what ``make_loader`` says when the machine or the arguments cannot work.

Found by an acceptance review (issues 3 and 14): a ``/dev/shm`` too small for the workers' batch
slots (docker's default is 64 MiB) was announced by a ``ResourceWarning`` that Python hides by
default, then ``make_loader`` failed in torch's allocator ("unable to allocate shared memory");
and DataLoader arguments that belong to the stream (``shuffle``, ``drop_last``, ``batch_size``)
were either passed on silently (``shuffle=False`` left the batches shuffled) or refused with
torch's words about ``batch_size=None``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_run import run_bounded, tails
from loader_fixtures import causal_cache  # noqa: F401
from loaders import ShardStream, make_loader

REPO = Path(__file__).resolve().parents[1]

SMALL_SHM_SCRIPT = """
import sys
from loaders import ShardStream, make_loader
from loaders.loader import shm_free_bytes, shutdown_workers
root = sys.argv[1]
print("free MiB", shm_free_bytes() / 2**20, flush=True)
small = make_loader(ShardStream(root, view="graphs", batch_size=8), num_workers=2)
print("fits", sum(1 for _ in small), "batches", flush=True)
shutdown_workers(small)
big = ShardStream(root, view="twins", batch_size=4096)
free = shm_free_bytes()
try:
    make_loader(big, num_workers=2)
finally:
    print("shm unchanged", shm_free_bytes() == free, flush=True)
print("UNREACHED", flush=True)
"""


def _private_small_shm() -> list[str] | None:
    """A command prefix that runs its command with a private 64 MiB tmpfs on /dev/shm (docker's default
    size), or ``None`` where this machine cannot make one (no ``unshare``, no user namespaces)."""
    if shutil.which("unshare") is None or not Path("/dev/shm").is_dir():
        return None
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return None
    return ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh"]


@pytest.mark.dist
def test_too_small_dev_shm_is_a_visible_warning_then_one_clear_error(causal_cache, tmp_path):
    """Issue 3 asks for a clear warning; Python hides plain ``ResourceWarning`` by default, so the
    warning must show under default filters, and the reservation that then fails must say why
    in our words (the numbers, the remedies), not only torch's allocator message."""
    prefix = _private_small_shm()
    if prefix is None:
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to give the run a 64 MiB /dev/shm")
    script = tmp_path / "small_shm.py"
    script.write_text(SMALL_SHM_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTHONWARNINGS", None)  # Python's default warning filters, as a user's script runs
    done = run_bounded([*prefix, sys.executable, str(script), str(causal_cache)], env, timeout_s=120)
    assert "fits " in done.stdout, tails(done)  # a loader that fits runs on 64 MiB
    assert done.returncode != 0 and "UNREACHED" not in done.stdout, tails(done)
    warned = [line for line in done.stderr.splitlines() if "SharedMemoryWarning: /dev/shm has" in line]
    assert len(warned) == 1 and "2 workers x (prefetch 4 + 6)" in warned[0] and "--shm-size" in warned[0], tails(done)
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"cachebuild\.errors\.SharedMemoryError: /dev/shm has \d+ MiB free, but ", last), tails(done)
    assert "2 workers x (prefetch 4 + 6)" in last and "MiB per batch" in last and "--shm-size" in last, tails(done)
    assert "shm unchanged True" in done.stdout, tails(done)  # what was reserved before the failure is released


def test_shm_warning_is_shown_under_default_filters(causal_cache, monkeypatch):
    """The warning's category is a ``ResourceWarning`` (what code catching those expects) that Python's default
    filters do not hide."""
    import warnings

    import loaders.loader as loader_mod

    monkeypatch.setattr(loader_mod, "shm_free_bytes", lambda path=loader_mod.SHM_PATH: 1 << 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("ignore", ResourceWarning)  # Python's default for ResourceWarning ...
        warnings.filterwarnings("default", category=loader_mod.SharedMemoryWarning)  # ... and the module's own filter, first
        loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=8), num_workers=1)
    loader_mod.shutdown_workers(loader)
    shown = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(shown) == 1 and "/dev/shm has 1 MiB free" in str(shown[0].message) and "--shm-size" in str(shown[0].message)


@pytest.mark.parametrize(
    "kwargs, points_to",
    [
        ({"shuffle": False}, "ShardStream(..., shuffle=False)"),
        ({"shuffle": True}, "ShardStream(..., shuffle=True)"),
        ({"drop_last": True}, "ShardStream(..., drop_last=True)"),
        ({"batch_size": 5}, "ShardStream(..., batch_size=5)"),
        ({"sampler": [0, 1]}, "the stream's epoch plan"),
        ({"batch_sampler": [[0]]}, "the stream's epoch plan"),
    ],
)
def test_stream_arguments_given_to_make_loader_point_to_the_stream(causal_cache, kwargs, points_to):
    stream = ShardStream(causal_cache, view="graphs", batch_size=8, seed=0)
    with pytest.raises(TypeError, match="make_loader") as err:
        make_loader(stream, num_workers=0, **kwargs)
    assert points_to in str(err.value) and "\n" not in str(err.value)


def test_len_is_the_whole_epoch_and_a_resumed_pass_yields_the_rest(causal_cache):
    """README: ``len(loader)`` stays a whole epoch's batches; a resumed pass yields ``len - state["batches"]``."""
    loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=8, seed=3), num_workers=0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    fresh = make_loader(ShardStream(causal_cache, view="graphs", batch_size=8, seed=3), num_workers=1)
    fresh.load_state_dict(state)
    assert len(fresh) == len(loader) > 4
    assert sum(1 for _ in fresh) == len(fresh) - state["batches"]
    assert len(fresh) == sum(1 for _ in fresh)  # the next pass is a whole epoch again


@pytest.mark.parametrize("prefetch", [0, -1])
def test_a_prefetch_factor_below_one_is_refused_not_replaced(causal_cache, prefetch):
    """It became 2 without a word (torch itself accepts 0 and fails at the first ``iter``)."""
    stream = ShardStream(causal_cache, view="graphs", batch_size=8, seed=0)
    with pytest.raises(ValueError, match=f"prefetch_factor must be >= 1 with num_workers > 0, got {prefetch}"):
        make_loader(stream, num_workers=1, prefetch_factor=prefetch)
    assert make_loader(stream, num_workers=1, prefetch_factor=None).prefetch_factor == 2  # torch's default
