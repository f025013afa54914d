"""Observe: what happened in the workspace during a round.

`watcher` (the watchdog observer and its health; `inotify`, the Linux specifics), `journal`
(the paths touched this round) and `rounds` (the round recorder: what the round's tools did).
"""
