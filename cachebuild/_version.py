"""The package version: its own module, so modules that record it (the manifest's ``created_by``) need not import the package."""

__version__ = "0.1.0"
