"""Writing files so that a failure leaves nothing behind: the folders a write made are removed again while
empty, and a file appears whole or not at all."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
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
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP ignored inside (in the main thread, where Python handles signals), for the cleanup
    of a failed write: a second Ctrl-C during it left a large output half-removed in a hidden folder. The failure
    being cleaned up ends the command anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {n: signal.getsignal(n) for n in signums}
    before = {n: h for n, h in before.items() if h is not None}  # (None: a handler not set from Python, left alone)
    for n in before:
        signal.signal(n, signal.SIG_IGN)
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(n, handler)


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


@contextmanager
def locked_folder(folder: Path) -> Iterator[Path]:
    """``folder`` (made, with its parents, if missing; removed again while empty if the block raises) under an
    exclusive lock for the block: writers that read a file in it, merge and replace it take turns, where two at
    once would each write what it read and lose the other's part. The lock is ``flock`` on the folder itself, so
    no lock file is left behind; processes and threads both wait for it. Where a folder takes no ``flock`` (Windows;
    NFS, which takes it as a write lock, on files open for writing), the block runs unlocked, as it did before."""
    folder = Path(folder)
    made = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl

            fd = os.open(folder, os.O_RDONLY)
        except (ImportError, OSError):
            fd = None
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # (released when fd closes)
                except OSError:
                    pass
            yield folder
        finally:
            if fd is not None:
                os.close(fd)
    except BaseException:
        remove_empty(made)
        raise


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse, before any work, an output folder that cannot be made or written to (creating nothing: the
    nearest folder that exists must be one, and writable); the OS's own errors come late or name a temporary
    folder. ``what`` names the folder in the message."""
    existing = Path(path).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what} {path}: {existing} is a file, not a folder; choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: {existing} is not writable; choose another folder")
