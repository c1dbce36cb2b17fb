"""``python -m cachebuild.cli``: the same as the ``cachebuild`` console script."""

from cachebuild.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
