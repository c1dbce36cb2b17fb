"""Two gloo ranks tally file votes from the ``mel`` view (a script for tests/test_mel_voting_review.py).

``python tests/vote_ranks_run.py CACHE PORT OUT`` writes, per rank, the leak fractions before and
after ``VoteAccumulator.all_reduce()`` to ``OUT/rank<r>.json``."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from cachebuild.mel.voting import VoteAccumulator  # noqa: E402
from loaders import ShardStream  # noqa: E402


def scores(batch: dict) -> torch.Tensor:
    """A stand-in model: a segment's logit from its own mel values (the same wherever it is read)."""
    return (batch["mel"].float().mean(dim=(1, 2, 3)) + 40.0) / 5.0


def tally(cache: str, **world: int) -> VoteAccumulator:
    stream = ShardStream(cache, view="mel", batch_size=300, seed=1, **world)
    acc = VoteAccumulator(stream.manifest.records, 40)
    for b in stream:
        acc.update(scores(b), b["file_id"], b["long_index"], b["is_pad"])
    return acc


def _rank(rank: int, cache: str, port: str, out: str) -> None:
    faulthandler.dump_traceback_later(100, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    acc = tally(cache)
    before = acc.result()[0].tolist()
    after = acc.all_reduce().result()[0].tolist()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"before": before, "after": after}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_rank, args=tuple(sys.argv[1:4]), nprocs=2)
