"""Tests with the real agent programs (marker `agents`)."""

import pytest

# checks.py holds the test bodies the per-agent modules collect: rewrite its asserts too.
pytest.register_assert_rewrite("tests.agents.checks")
