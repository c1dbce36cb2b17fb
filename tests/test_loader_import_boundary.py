"""What ``import loaders`` loads of cachebuild: the format, its errors and checks, never the builder or a generator.

DESIGN: "the loader reads the manifest, never the generator's code"; the ast checks of
``tests/test_architecture.py`` see the import statements, this test sees what importing runs
(``cachebuild/__init__.py`` runs before any ``cachebuild.format`` module a loader imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED = ("cachebuild", "cachebuild._version", "cachebuild.errors", "cachebuild.checks")


def _loaded_after(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'cachebuild')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_loader_runs_no_builder_or_generator_code():
    loaded = _loaded_after("import loaders\nfrom loaders import ShardStream, make_loader, to_device")
    wrong = [m for m in loaded if m not in ALLOWED and not m.startswith("cachebuild.format")]
    assert not wrong, f"import loaders loads {wrong}"


def test_the_public_builder_api_still_imports_from_the_package():
    loaded = _loaded_after(
        "from cachebuild import FunctionSource, build, BuildOptions, RecordSource, __version__\nimport cachebuild\nassert sorted(cachebuild.__all__) == cachebuild.__all__\nfor n in cachebuild.__all__: getattr(cachebuild, n)"
    )
    assert "cachebuild.api" in loaded and "cachebuild.builder.builder" in loaded
