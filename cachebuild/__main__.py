"""``python -m cachebuild``: the same as the ``cachebuild`` console script (and ``python -m cachebuild.cli``)."""

from cachebuild.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
