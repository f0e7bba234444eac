"""The package version (one place: the package, the plan cache key and the CLI read it)."""

__version__ = "0.1.0"
