"""The real Codex CLI, driven headless by the scripted model server (see checks.py, sessions.py)."""

from __future__ import annotations

from tests.agents import checks

AGENT = "codex"

# In this order: the restore changes the project, so it comes last.
test_task_is_the_session = checks.test_task_is_the_session
test_checkpoint_per_round_byte_exact = checks.test_checkpoint_per_round_byte_exact
test_diff_names_the_changes = checks.test_diff_names_the_changes
test_hooks_change_no_model_request = checks.test_hooks_change_no_model_request
test_restore_baseline_exactly = checks.test_restore_baseline_exactly
