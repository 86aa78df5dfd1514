"""Who may do what to a path, judged from the mode bits for an account that is not this process.

`os.access` answers only for the calling process; `gpugate selftest` runs as root and must
judge for SlurmUser or a job's user, so the bits are read by hand (owner, group, other), along
every directory on the way. Also the `Problem` every selftest check returns.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class Account:
    """A local user as the kernel judges it: uid and every group id (the primary one first)."""

    name: str
    uid: int
    gids: tuple[int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing that would break, and what to do about it."""

    what: str
    fix: str


@dataclass(frozen=True)
class Caution(Problem):
    """One thing that works less well than asked but breaks nothing: a warning, not "broken"."""


def account(name: str) -> Account:
    """The account `name`; KeyError when there is none."""
    entry = pwd.getpwnam(name)
    # getgrouplist puts the group it is given first: gids[0] is the primary group.
    return Account(name, entry.pw_uid, tuple(os.getgrouplist(name, entry.pw_gid)))


def group_name(who: Account) -> str:
    """The name of `who`'s primary group (its number when the group has no name)."""
    if not who.gids:
        return who.name
    try:
        return grp.getgrgid(who.gids[0]).gr_name
    except KeyError:
        return str(who.gids[0])


def bits(st: os.stat_result, who: Account) -> int:
    """The rwx bits (as 0o7) that apply to `who` on a file of this stat."""
    if who.uid == st.st_uid:
        return (st.st_mode >> 6) & 7
    if st.st_gid in who.gids:
        return (st.st_mode >> 3) & 7
    return st.st_mode & 7


def _class(st: os.stat_result, who: Account) -> str:
    """Which of chmod's u, g, o applies to `who` on a file of this stat."""
    if who.uid == st.st_uid:
        return "u"
    return "g" if st.st_gid in who.gids else "o"


def closed_dirs(path: str, who: Account) -> list[tuple[str, str]]:
    """Each directory on the way to `path` (and `path`, when it is one) that `who` may not
    traverse, outermost first, with the chmod that opens it for traversal only (no listing)."""
    path = os.path.abspath(path)
    closed: dict[str, str] = {}
    for place in dict.fromkeys((path, os.path.realpath(path))):
        chain = [place]
        while chain[-1] != "/":
            chain.append(os.path.dirname(chain[-1]))
        for directory in reversed(chain):
            try:
                st = os.stat(directory)
            except OSError:
                break  # what is not there yet is not closed
            if not os.path.isdir(directory):
                break
            if who.uid != 0 and not bits(st, who) & 1:
                closed[directory] = f"chmod {_class(st, who)}+x {directory}"
    return list(closed.items())


def denied(path: str, who: Account, want: int) -> str | None:
    """Why `who` may not open `path` for `want` (4 read, 2 write, 1 execute); None if allowed."""
    path = os.path.abspath(path)
    # The directories on the way, of the path as named and of where its links lead.
    for place in dict.fromkeys((path, os.path.realpath(path))):
        parent = os.path.dirname(place)
        while True:
            try:
                st = os.stat(parent)
            except OSError:
                break  # reported below, as the file's own absence
            if who.uid != 0 and not bits(st, who) & 1:
                return f"{parent} is closed to {who.name} (mode {st.st_mode & 0o7777:04o})"
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror.lower() if exc.strerror else exc}"
    if who.uid == 0:  # root may do anything but run a file no one may run
        return None if want != 1 or st.st_mode & 0o111 or os.path.isdir(path) else "no x bit"
    if bits(st, who) & want != want:
        return f"{path} is mode {st.st_mode & 0o7777:04o} owned by {st.st_uid}:{st.st_gid}"
    return None
