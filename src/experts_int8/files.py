"""Writing files so that a failure leaves nothing behind: the folders a write made are removed again while
empty, and a file appears whole or not at all."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet (what ``mkdir(parents=True)`` makes), deepest first."""
    path = Path(path).resolve()
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: what a failed write made, not what others put there."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty or gone
            break


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path of its own beside ``path`` (its folder made, with its parents, if missing) to write;
    synced and renamed to ``path`` when the block ends, removed (with the folders made) when it raises: a crash or
    a full disk leaves the old file or none, never a part."""
    path = Path(path)
    made = missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            yield Path(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o644)  # (mkstemp's 0600 would hide a shared folder's file from other users)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except BaseException:
        remove_empty(made)
        raise


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
