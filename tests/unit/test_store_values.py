"""`shadowpoint.store.values`: the shadow repository's plain values import without pygit2 (the
stages that only need modes, tree entries and ref names do not load libgit2), and `shadow_repo`
uses the same objects."""

from __future__ import annotations

import json
import subprocess
import sys

from shadowpoint.store import shadow_repo, values


def test_importing_values_does_not_import_pygit2() -> None:
    probe = ("import json, sys; import shadowpoint.store.values; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('pygit2', '_pygit2'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_the_repository_uses_the_same_values() -> None:
    names = vars(shadow_repo)  # its own names, imported from values (not re-exported)
    assert names["TreeEntry"] is values.TreeEntry
    assert names["task_ref"] is values.task_ref
    assert values.task_ref("a/b") == f"refs/shadowpoint/tasks/{values.ref_component('a/b')}"
