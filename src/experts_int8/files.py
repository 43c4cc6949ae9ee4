"""Writing files so that a failure leaves nothing behind: the folders a write made are removed again while
empty, and a file appears whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a synced temporary file of its own in the same folder (made, with its
    parents, if missing), renamed into place: a crash or a full disk leaves the old file or none, never a part,
    and no folder it made."""
    path = Path(path)
    made = missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # (mkstemp's 0600 would hide a shared folder's file from other users)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except BaseException:
        remove_empty(made)
        raise
    return path
