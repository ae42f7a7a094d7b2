"""Loaded by the interpreter at start when this directory is on PYTHONPATH (tests only)."""

from tests.stuck_reads import install

install()
