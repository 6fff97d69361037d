"""Benchmark scripts, each run as ``python benchmarks/<name>.py`` (see docs/benchmarks.md). A package so that
they import each other as ``benchmarks.<name>`` and mypy names each module the same way."""
