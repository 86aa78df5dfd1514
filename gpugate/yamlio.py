"""Read and write YAML, with a parsed-file cache that keeps PyYAML off the hot path.

Importing PyYAML costs more than the whole checklist (it compiles large regexes at import; the
packages bundle its pure-Python variant, slower still). The site config and a replayed snapshot
rarely change, so the parsed form of each file is kept in `marshal` form (no import to pay,
and it keeps YAML's integer keys, which JSON would turn into strings), found by the file's
identity (device, inode, size, mtime, ctime) like `.pyc` files and, unlike them, checked
against the file's bytes (length and CRC-32) before it is used: a file rewritten in place within
one timestamp tick is parsed again, never served stale. A miss, an unwritable cache, a corrupt
entry or one anybody else could have written just means parsing the YAML.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import zlib

from gpugate.fsutil import atomic_write, open_regular, read_open

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Bump when the cached representation changes (1: JSON; 2: marshal, checked by CRC-32).
_CACHE_FORMAT = "2"
# marshal's format belongs to the interpreter: an upgraded python3 reads only its own entries.
_CACHE_TAG = f"v{_CACHE_FORMAT}-py{sys.version_info[0]}{sys.version_info[1]}-m{marshal.version}"
# A config or a snapshot (kernel lines included) is well under this; a bigger one is refused.
YAML_MAX = 64 << 20
CACHE_MAX = 256 << 20  # a cached parse of a file under YAML_MAX


class YamlError(ValueError):
    """A YAML file could not be read or parsed; the message names the file."""


def cache_dir() -> str | None:
    """Where parsed files are cached, or None when caching is off."""
    env = os.environ.get("GPUGATE_CACHE_DIR")
    if env is not None:
        return env or None
    if os.geteuid() == 0:
        return "/var/cache/gpugate"
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "gpugate")


def load_yaml(path: str) -> object:
    """Parse a YAML file (or fetch its parsed form from the cache)."""
    return load_yaml_identified(path)[0]


def load_yaml_identified(path: str) -> tuple[object, str]:
    """load_yaml's answer and the file's identity: its cache key, length and CRC-32, which
    change with every rewrite (what a cache built from the parsed file is keyed by)."""
    try:  # a FIFO or a device named as a config or snapshot is refused, never waited on
        fd = open_regular(path)
        try:
            # One descriptor for the key and the bytes: a file replaced between the two cannot
            # put one file's parse under another's key.
            key = _cache_key(os.fstat(fd))
            raw = read_open(fd, YAML_MAX, path)
        finally:
            os.close(fd)
    except OSError as exc:
        raise YamlError(f"{path}: cannot read: {exc.strerror}") from None
    check = (len(raw), zlib.crc32(raw))
    identity = f"{key}:{check[0]:x}:{check[1]:08x}"
    cached = _cache_read(key, check)
    if cached is not None:
        return cached[0], identity
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise YamlError(f"{path}: cannot read: {exc}") from None
    data = parse_yaml(text, path)
    _cache_write(key, check, data)
    return data, identity


def parse_yaml(text: str, name: str = "<string>") -> object:
    """Parse YAML text with the safe (C when available) loader."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(f"{name}: not valid YAML{where}: {problem}") from None
    except Exception as exc:  # constructors raise plain errors: `2020-13-45`, `0b_`, 5000 digits
        raise YamlError(f"{name}: not valid YAML: {type(exc).__name__}: {exc}") from None


def dump_yaml(data: object) -> str:
    """Block-style YAML with keys in the given order."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100)


def read_cached(name: str, check: tuple[int, int]) -> tuple[object] | None:
    """(data,) kept under `name` (made with `check`, two integers of its input), else None."""
    return _cache_read(f"{_CACHE_TAG}-{name}", check)


def write_cached(name: str, check: tuple[int, int], data: object) -> None:
    """Keep `data` under `name` in the private cache, as parsed files are (best effort)."""
    _cache_write(f"{_CACHE_TAG}-{name}", check, data)


def _cache_key(st: os.stat_result) -> str:
    # (device, inode) names the file whatever path reached it; size and both times change
    # with every rewrite (ctime even when a writer restores mtime). The CRC-32 stored inside
    # catches what the times cannot (a same-size rewrite within one clock tick). No hashlib:
    # it costs more to import than the lookup saves; zlib is built in.
    return f"{_CACHE_TAG}-{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ctime_ns:x}"


def _private(st: os.stat_result) -> bool:
    """Ours alone: owned by this user and writable by nobody else (marshal trusts its input)."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _private_dir(directory: str) -> bool:
    """A real directory (not a symlink) that is ours alone."""
    st = os.lstat(directory)
    return stat.S_ISDIR(st.st_mode) and _private(st)


def _cache_read(key: str, check: tuple[int, int]) -> tuple[object] | None:
    """(data,) from a valid entry for `key` whose file had length and CRC `check`, else None."""
    directory = cache_dir()
    if not directory:
        return None
    try:
        # Never through a symlink, never from a directory or file anybody else could write.
        if not _private_dir(directory):
            return None
        fd = open_regular(os.path.join(directory, key), follow=False)
        try:
            if not _private(os.fstat(fd)):
                return None
            raw = read_open(fd, CACHE_MAX, key)
        finally:
            os.close(fd)
        entry = marshal.loads(raw)  # noqa: S302 - only a file this user alone could write
    except (OSError, ValueError, EOFError, TypeError):
        return None  # missing, refused or corrupt: parse the YAML
    if not isinstance(entry, tuple) or len(entry) != 3 or entry[:2] != check:
        return None  # another file's bytes (stale or renamed): parse the YAML
    return (entry[2],)


def _cache_write(key: str, check: tuple[int, int], data: object) -> None:
    """Keep `data` under `key` (best effort: any problem leaves the cache as it was)."""
    directory = cache_dir()
    if not directory:
        return
    # Whatever YAML gave: marshal takes what it can hold and refuses the rest (ValueError).
    entry: Any = (*check, data)
    try:
        blob = marshal.dumps(entry)
    except ValueError:
        return  # dates and other YAML-only types: not worth caching
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Only our own, private, real directory: never write through someone else's.
        if not _private_dir(directory):
            return
        atomic_write(os.path.join(directory, key), blob, mode=0o600)
    except OSError:
        return
