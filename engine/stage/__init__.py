"""Stage: from a round's record to the blobs and tree entries of a checkpoint.

`stager` (the plan: explicit paths, the watcher's paths, or a rescan), `scanner` (carries it
out, and builds the baseline, taking `early_capture` requests), `exclusions` with `patterns`
(git's wildmatch), `stat_cache`, `blob_workers` (parallel hashing) and `git_index` (ids the
user's own index proves unchanged).
"""
