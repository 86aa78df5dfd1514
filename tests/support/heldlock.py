"""Hold a lock file from another process, as a user's job would: `with held(path): ...`."""

from __future__ import annotations

import contextlib
import multiprocessing
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator


def _hold(path: str, ready, done) -> None:
    import fcntl

    fd = os.open(path, os.O_RDONLY)  # read-only is all flock needs
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    done.wait(120)


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
    """Another process holds an exclusive flock on `path` (created if missing) meanwhile."""
    if not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, ready, done), daemon=True)
    holder.start()
    try:
        assert ready.wait(30), f"{path}: the holder never got the lock"
        yield
    finally:
        done.set()
        holder.join(30)
