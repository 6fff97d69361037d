"""The tiny build of tests/loaders, for the examples' tests."""

from tests.loaders.conftest import tiny_build

__all__ = ["tiny_build"]
