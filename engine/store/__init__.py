"""Store: the shadow repository and the task records kept beside it.

`shadow_repo` (the only pygit2 user) with `values` (its modes, tree entries and ref names,
without pygit2), `packing` (gc packs), `borrowed` (blobs borrowed from
the user's objects), `checkpoints` (task metadata) with `recovery`, `storage` (report,
retention, gc), `locking` (the workspace lock) and `atomic` (temp-and-rename writes).
"""
