"""The lock of a run folder: one writer at a time.

`RunLock` holds an OS file lock (``fcntl.flock``) on ``<run>/.lock`` while a process writes the
folder, and records the holder's PID and start time there. A second writer gets a one-line
`FeaturelabError` naming them. The OS releases the lock when its holder exits, however it dies, so a
lock file left by a dead process is simply taken over (its stale PID is overwritten), and the temporary
files of a writer killed mid-write are removed (`featurelab.io.remove_temporaries`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from ..errors import FeaturelabError
from ..io import make_folder, remove_temporaries, write_error

LOCK_NAME = ".lock"


class RunLock:
    """``with RunLock(run_dir):`` the folder is this process's until the block ends (the folder is
    created if needed; a folder that cannot be written is a one-line `featurelab.errors.WriteError`).
    `wait` is what a second writer is told to do."""

    def __init__(self, run_dir: str | Path, wait: str = "wait for it to finish, then try again"):
        self.path = Path(run_dir) / LOCK_NAME
        self.wait = wait
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        make_folder(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise write_error(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise FeaturelabError(
                f"run folder '{self.path.parent}' is being written by {holder}; {self.wait}"
            ) from None
        holder = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError:  # a full disk: the lock holds all the same, a second writer is told "another process"
            pass
        self._fd = fd
        remove_temporaries(self.path.parent)
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    """'process PID (started TIME)' from the lock file, or a generic phrase while it is being written."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {int(info['pid'])} (started {info['started']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
