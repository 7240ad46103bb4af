"""The package's version, in a module of its own so that its parts read it without importing the package."""

__version__ = "0.1.0.dev0"
