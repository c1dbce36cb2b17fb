"""Review of ``compact="pool"`` and ``TwinsContext`` as a new user meets them (2026-11-24).

Each test is a defect the review found (it failed before its fix) or a README recipe that had
none: a plain or torchdata ``DataLoader`` as the context's source, one-line refusals (a path,
a bad or absent device, a batch of another mode or batch size, which was expanded silently
wrong), the ``decoder="process"`` lifetime (a dropped context, an exception at exit, a killed
trainer: no process and no ``/dev/shm`` segment left), and the README's Lightning datamodule.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from cachebuild.errors import CacheMismatchError
from loader_fixtures import causal_cache  # noqa: F401
from loaders import ShardStream, TwinsContext

KW = {"view": "twins", "batch_size": 1500, "seed": 4, "mix": 64}
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _same(got: dict, want: dict) -> bool:
    return list(got) == list(want) and all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)


def test_a_plain_or_torchdata_dataloader_is_a_source_like_make_loader(causal_cache):
    stream = ShardStream(causal_cache, compact="pool", **KW)
    loaders = [DataLoader(stream, batch_size=None, num_workers=0)]
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loaders.append(stateful.StatefulDataLoader(stream, batch_size=None, num_workers=0))
    full = ShardStream(causal_cache, **KW)
    for dl in loaders:
        with TwinsContext(dl) as ctx:
            assert ctx.stream is stream
            batch = next(iter(dl))
            _, epoch, b = ctx.meta(batch)
            assert _same(ctx.expand(batch), full.batch(b, epoch))


def test_bad_arguments_are_one_line_each(causal_cache):
    stream = ShardStream(causal_cache, compact="pool", **KW)
    with pytest.raises(TypeError, match="TwinsContext needs the ShardStream.*got str"):
        TwinsContext(str(causal_cache))
    with pytest.raises(ValueError, match="device='gpu' is not a torch device"):
        TwinsContext(stream, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda', but this torch sees no CUDA device"):
            TwinsContext(stream, device="cuda")
    with TwinsContext(stream, prefetch=False) as ctx:
        for mode in (True, False):  # a batch of the other modes
            with pytest.raises(ValueError, match="not a compact='pool' twins batch") as e:
                ctx.expand(ShardStream(causal_cache, compact=mode, **KW).batch(0, 0))
            assert "\n" not in str(e.value)


def test_a_batch_of_another_batch_size_is_refused_not_expanded_wrong(causal_cache):
    """Batch size is not in the plan's fingerprint (the pools do not depend on it), but the batch number
    does: the context held the pools of ``b * 1500``, not of ``b * 750``, and expanded other graphs."""
    other = ShardStream(causal_cache, compact="pool", **dict(KW, batch_size=750))
    with TwinsContext(ShardStream(causal_cache, compact="pool", **KW), prefetch=False) as ctx:
        for b in range(0, other.plan(0).batches, 5):
            with pytest.raises(CacheMismatchError, match="twins batch of 750 rows, but .* makes batches of 1500"):
                ctx.expand(other.batch(b, 0))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("processes", [1, 2])
def test_a_dropped_process_context_stops_its_process_and_frees_its_shared_memory(causal_cache, processes):
    stream = ShardStream(causal_cache, compact="pool", **KW)
    ctx = TwinsContext(stream, decoder="process", processes=processes)
    ctx.expand(stream.batch(0, 0))
    procs, shm = ctx._decoder._procs, ctx._decoder._shm.name  # type: ignore[union-attr]
    assert len(procs) == processes and all(p.is_alive() for p in procs) and os.path.exists(f"/dev/shm/{shm}")
    del ctx
    for proc in procs:
        proc.join(timeout=10)
        assert not proc.is_alive()
    assert not os.path.exists(f"/dev/shm/{shm}")


_TRAINER = """
import os, signal, sys
from loaders import ShardStream, TwinsContext
stream = ShardStream(sys.argv[1], view="twins", batch_size=1500, seed=4, mix=64, compact="pool")
ctx = TwinsContext(stream, decoder="process", processes=int(sys.argv[3]))
for i, batch in enumerate(stream):
    ctx.expand(batch)
    if i == 2:
        break
print(*(p.pid for p in ctx._decoder._procs), ctx._decoder._shm.name, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
raise RuntimeError("the training loop failed")
"""


@pytest.mark.parametrize("end,processes", [("raise", 1), ("kill", 1), ("kill", 2)])
def test_a_trainer_that_fails_or_is_killed_leaves_no_decode_process_nor_shared_memory(causal_cache, end, processes, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out, err = tmp_path / "out", tmp_path / "err"  # files, not pipes: a decode process left over would hold a pipe open
    with open(out, "w") as o, open(err, "w") as e:
        subprocess.run([sys.executable, "-c", _TRAINER, str(causal_cache), end, str(processes)], stdout=o, stderr=e, timeout=60, env=env, stdin=subprocess.DEVNULL)
    *pids, shm = out.read_text().split()
    stderr = err.read_text()
    assert len(pids) == processes, stderr
    deadline = time.monotonic() + 5
    while any(_alive(int(p)) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not any(_alive(int(p)) for p in pids), f"a decode process of {pids} outlived its trainer ({end})"
        assert not os.path.exists(f"/dev/shm/{shm}")
        assert "leaked shared_memory" not in stderr, stderr
    finally:
        for p in pids:
            if _alive(int(p)):
                os.kill(int(p), 9)


def _snippet(tag: str) -> str:
    text = README.read_text()
    body = text.split(f"<!-- {tag} -->", 1)[1].split(f"<!-- /{tag} -->", 1)[0]
    return textwrap.dedent(body.split("```python", 1)[1].split("```", 1)[0])


@pytest.mark.filterwarnings("ignore::FutureWarning")  # Lightning 2.6's own (torch's pytree API), in this process
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")  # its advice on workers and IterableDataset length
@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
def test_the_readme_lightning_recipe_trains_on_the_default_keys(causal_cache, tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    scope = {"root": str(causal_cache)}
    exec(compile(_snippet("twins-pool-lightning").replace('batch_size=4096, compact="pool"', 'batch_size=1500, seed=4, mix=64, compact="pool"'), str(README), "exec"), scope)
    dm = scope["dm"]
    dm.loader_kwargs = {"num_workers": 1, "prefetch_factor": 2}
    full, seen = ShardStream(causal_cache, **KW), []

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            _, epoch, b = dm.meta
            assert _same(batch, full.batch(b, epoch)), (epoch, b)
            seen.append((self.current_epoch, epoch, b))
            return (self.w * batch["delta"].mean()) ** 2

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=6, logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path
    )
    trainer.fit(Model(), datamodule=dm)
    assert seen == [(e, e, b) for e in range(2) for b in range(6)]
    assert dm.ctx is None  # closed by teardown
