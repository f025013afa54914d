"""shadowpoint: a filesystem-event-driven checkpoint engine for AI coding agents.

Snapshots a workspace into a shadow git repository (its own git dir, `core.worktree`
pointing at the workspace) after every round of tool calls, and restores files, the
conversation, or both, to any checkpoint. The user's own `.git` is never touched.
"""

from __future__ import annotations

__version__ = "0.1.0"
