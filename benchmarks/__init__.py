"""shadowpoint's benchmark suite: the engine against the seed's git CLI engine, same tree, same run.

`python -m benchmarks --size 10k,100k` (or, later, `shadowpoint bench`) generates
deterministic workspaces (`treegen`), runs the scenarios (`scenarios`) for ours
(`ours`, the engine in-process) and the rival (`rivals`, the git CLI), and writes a
table, JSON and a chart (`report`). Speed lives here, never in timed unit tests.
"""
