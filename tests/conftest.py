"""Test-session set-up: this folder is on ``sys.path`` (pytest's rootdir conftest), so every test,
including those under ``tests/distributed/``, imports the shared ``helpers`` module."""
