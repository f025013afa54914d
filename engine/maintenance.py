"""Storage upkeep for an engine's roots, off the agent's path: garbage collection in the
background (after a deletion, or once loose objects pile up), retention limits, and the
checkpoints folder going with the last task (unless another engine still uses it)."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from shadowpoint.options import EngineOptions
from shadowpoint.roots import RootState
from shadowpoint.store.locking import SharedUse
from shadowpoint.store.shadow_repo import loose_object_estimate, pack_count
from shadowpoint.store.storage import USERS_FILE, apply_retention
from shadowpoint.store.storage import collect_garbage as collect_repo_garbage

log = structlog.get_logger(__name__)

# git's gc.auto and gc.autoPackLimit thresholds; checked every AUTO_PACK_EVERY checkpoints
# (two listdirs). Rounds write small packs, merged as they go (`ShadowRepo.merge_small_packs`)
# into packs of up to SMALL_PACK_OBJECTS objects, which only a collection merges further.
AUTO_PACK_LOOSE = 6700
AUTO_PACK_PACKS = 50
AUTO_PACK_EVERY = 25


class _Closing(Exception):
    """The engine closes: an upkeep collection stops at its next pause."""


class Maintenance:
    """Upkeep of the shadow repositories of `roots` (one engine's)."""

    def __init__(self, roots: Mapping[str, RootState], options: EngineOptions, closed: Callable[[], bool],
                 pause: Callable[[], None] | None = None) -> None:
        """`pause`: called by a background collection between batches of objects, to yield
        to the agent's rounds (`Engine.yield_to_rounds`)."""
        self.roots = roots
        self.options = options
        self._closed = closed
        self._pause = pause
        # a share of the checkpoints folder for as long as the engine runs (locking.SharedUse)
        self._users = SharedUse(options.docs_dir / USERS_FILE)
        self._background: list[threading.Thread] = []
        self._checkpoints = 0

    def collect_in_background(self, *, upkeep: bool = False) -> None:
        """Free what deleted tasks alone referenced (and pack loose objects), off the request path.

        `upkeep`: a collection only to pack loose objects (`checkpointed`), which stops at its
        next pause when the engine closes; a later one does its work (an interrupted collection
        leaves a valid repository). At 100k files with borrowed blobs it packs ~800 MB, and a
        sidecar's exit waited minutes for it. One that frees a deletion's objects completes.
        """
        dirs = [root.ws.git_dir for root in self.roots.values() if root.ws.git_dir.is_dir()]
        if not dirs or self._closed():
            return

        def pause() -> None:
            if upkeep and self._closed():
                raise _Closing
            if self._pause is not None:
                self._pause()

        def run() -> None:
            log.info("storage.collect_started", upkeep=upkeep)
            try:
                collect_repo_garbage(self.options.docs_dir, grace_s=self.options.gc_grace_s,
                                     lock_timeout_s=self.options.lock_timeout_s, only=dirs,
                                     locks={root.ws.git_dir: root.lock for root in self.roots.values()},
                                     pause=pause)
            except _Closing:
                log.info("storage.collect_stopped", reason="the engine closes", action="a later collection resumes")
            except Exception:  # never fatal: the next collection tries again
                log.exception("storage.collect_failed")

        t = threading.Thread(target=run, name="shadowpoint-gc", daemon=True)
        self._background = [w for w in self._background if w.is_alive()]
        self._background.append(t)
        t.start()

    def _collecting(self) -> bool:
        return any(w.is_alive() for w in self._background)

    def collect_now(self, grace_s: float) -> dict[str, Any]:
        """Drop the objects no task reaches any more, in every root's shadow repo."""
        out = {}
        for name, root in self.roots.items():
            if not root.ws.git_dir.is_dir():
                continue
            with root.locked() as r:
                kept, freed = r.repo.collect_garbage(grace_s)
                # the stat cache may name blobs of uncommitted scans (a diff): forget them
                r.reset_cache(r.cache.base_commit)
            out[name] = {"kept": kept, "freedBytes": freed}
        return out

    def checkpointed(self) -> None:
        """One more checkpoint: now and then, pack loose objects (each costs a disk block) and merge
        packs; not while a collection runs (one yielding to a quick succession of rounds outlasts
        25 of them, and a second would pack the same objects beside it)."""
        self._checkpoints += 1
        if self._checkpoints % AUTO_PACK_EVERY == 0 and not self._collecting() and any(
            loose_object_estimate(r.ws.git_dir) > AUTO_PACK_LOOSE or pack_count(r.ws.git_dir) > AUTO_PACK_PACKS
            for r in self.roots.values()
        ):
            self.collect_in_background(upkeep=True)

    def retain(self, live: set[str]) -> None:
        """Apply the retention limits (oldest tasks first; the `live` ones are kept)."""
        if self.options.retention.is_unlimited:
            return
        if apply_retention(self.options.docs_dir, self.options.retention, protect=live):
            self.collect_in_background()

    def remove_checkpoints_folder(self) -> None:
        """The last task went: the whole checkpoints folder goes too (SPEC §2), unless another
        process works in it (its task may have no record yet): then only a collection."""
        # A collection an earlier deletion started may still be writing its pack in there:
        # removing the folder under it left the folder behind (a CI run caught it).
        self.join()
        with self._users.sole() as sole:
            if not sole:
                log.info("storage.checkpoints_kept", docs_dir=str(self.options.docs_dir),
                         reason="another process uses them")
                self.collect_in_background()
                return
            # under every root's lock: a background write (a stat cache, a merge of small packs)
            # waiting for it finds the folder gone afterwards, and never makes it again
            with contextlib.ExitStack() as held:
                for root in self.roots.values():
                    held.enter_context(root.locked()).forget_repo()
                shutil.rmtree(self.options.docs_dir / "checkpoints", ignore_errors=True)
        log.info("storage.checkpoints_removed", docs_dir=str(self.options.docs_dir))

    def join(self) -> None:
        """Wait for the background collections started so far."""
        for worker in self._background:
            worker.join()

    def close(self) -> None:
        self.join()
        self._users.close()
