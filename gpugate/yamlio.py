"""Read and write YAML, with a parsed-file cache that keeps PyYAML off the hot path.

Importing PyYAML costs more than the whole checklist (it compiles large regexes at import).
The site config and a replayed snapshot rarely change, so the parsed form of each file is kept
as JSON keyed by the file's identity (device, inode, size, mtime, ctime) — the same idea as
`.pyc` files. A miss, an unwritable cache or a corrupt entry just means parsing the YAML.
"""

from __future__ import annotations

import json
import os

# Bump when the cached representation changes.
_CACHE_FORMAT = "1"
# A config or a snapshot (kernel lines included) is well under this; a bigger one is refused.
YAML_MAX = 64 << 20
CACHE_MAX = 256 << 20  # a cached parse is JSON of a file under YAML_MAX


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
    from gpugate.fsutil import open_regular, read_regular

    try:  # a FIFO or a device named as a config or snapshot is refused, never waited on
        fd = open_regular(path)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise YamlError(f"{path}: cannot read: {exc.strerror}") from None
    key = _cache_key(path, st)
    cached = _cache_read(key)
    if cached is not None:
        return cached[0]
    try:
        text = read_regular(path, YAML_MAX).decode("utf-8", errors="strict")
    except OSError as exc:
        raise YamlError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise YamlError(f"{path}: cannot read: {exc}") from None
    data = parse_yaml(text, path)
    _cache_write(key, data)
    return data


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


def _cache_key(path: str, st: os.stat_result) -> str:
    # (device, inode) names the file whatever path reached it; size and both times change
    # with every rewrite (ctime even when a writer restores mtime). No hashing: hashlib alone
    # costs more to import than the lookup saves.
    return f"v{_CACHE_FORMAT}-{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ctime_ns:x}"


def _cache_read(key: str) -> tuple[object] | None:
    directory = cache_dir()
    if not directory:
        return None
    try:
        from gpugate.fsutil import read_regular

        raw = read_regular(os.path.join(directory, key + ".json"), CACHE_MAX, follow=False)
        return (json.loads(raw),)
    except (OSError, ValueError):
        return None


def _cache_write(key: str, data: object) -> None:
    directory = cache_dir()
    if not directory:
        return
    try:
        text = json.dumps(data)
    except (TypeError, ValueError):
        return  # dates and other YAML-only types: not worth caching
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        # Only our own, private, real directory: never write through someone else's.
        if not os.path.isdir(directory) or os.path.islink(directory) or st.st_uid != os.geteuid():
            return
        from gpugate.fsutil import atomic_write

        atomic_write(os.path.join(directory, key + ".json"), text, mode=0o600)
    except OSError:
        return
