"""The package version, in a module of its own: whatever needs it imports no more than this."""

__version__ = "0.1.0"
