"""A scratch folder owned by the live process that made it (`OwnedFolder`), and the ones that dead
processes left, removed (`clear_stale`).

A process holds a lock on its scratch folder's `lock` file for as long as the folder lives;
the system releases it when the process dies, however it dies (SIGKILL, out of memory), so a
folder whose lock can be taken belongs to no live process and can go. The folder is locked
before it has its name: `clear_stale` never sees it unlocked.

    with OwnedFolder(run.path / "end.scratch") as folder:   # made, locked; removed on exit
        ...
    clear_stale(out.glob("*/end.scratch"))               # what killed processes left
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

LOCK = "lock"


class OwnedFolder:
    """The folder `path`, made (replacing one a dead process left there) and locked on entry,
    removed on exit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: int | None = None

    def __enter__(self) -> Path:
        clear_stale([self.path])
        making = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        shutil.rmtree(making, ignore_errors=True)
        making.mkdir(parents=True)
        self._lock = os.open(making / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        making.rename(self.path)
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)  # releases the lock
            self._lock = None


def clear_stale(folders: Iterable[Path]) -> list[Path]:
    """Remove each of `folders` that no live process holds (see the module's docstring; one
    without a lock file too: no process of this layout made it); the ones removed."""
    cleared = []
    for folder in folders:
        if folder.is_dir() and not _held(folder):
            shutil.rmtree(folder, ignore_errors=True)
            cleared.append(folder)
    return cleared


def _held(folder: Path) -> bool:
    """Whether a live process holds `folder`'s lock."""
    try:
        lock = os.open(folder / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(lock)
