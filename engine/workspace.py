"""Workspace roots: validation, canonical paths, the workspace hash, and `RepoPath` conversion.

`RepoPath` (a POSIX, root-relative `str`) is never a disk path; only this module converts
between the two. Used by every thread; holds no mutable state.
"""

from __future__ import annotations

import hashlib
import os
from typing import NewType

RepoPath = NewType("RepoPath", str)
