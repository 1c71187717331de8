"""Imported by the fork server of :mod:`tests.forked` before its first fork: the slow imports, once."""

from tests.forked import preload

preload()
