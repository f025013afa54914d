"""Restore: compare checkpoints and put files back.

`diff` (compare), `plan` (restore plans), `safe_fs` (the symlink-proof writer) and `restorer`
(safety checkpoint, journal, undo, message edits).
"""
