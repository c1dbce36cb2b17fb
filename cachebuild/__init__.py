"""cachebuild: pre-generate training data into compressed tar shards, offline and in parallel."""

__version__ = "0.1.0"
