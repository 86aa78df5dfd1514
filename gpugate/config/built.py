"""The built Config, cached: a hook's start does not validate the same config again.

Building the Config from the parsed files (classes split off, the site file checked on its
own, the merge, ~40 records checked key by key) costs a replayed check about 1-2 ms, on every
run, for files that rarely change. The result is kept in the parsed-YAML cache's directory
(gpugate/yamlio.py: this user's own, private; `marshal`, never pickle), found by everything it
was built from: the packaged defaults' and the site file's identities (the parsed-YAML
cache's key, length and CRC-32 of each: any rewrite changes them), this node and the job's
partition when the config has node classes, and the code that validates (gpugate's version
and the identity of the schema, the loader and the check modules). The entry holds that whole
description, compared before use, so a CRC collision is a miss, never another config. Any
problem (no cache, a corrupt entry, a value marshal cannot hold) means building it as before.
"""

from __future__ import annotations

import os
import zlib

from gpugate import __version__
from gpugate.config import classes, schema
from gpugate.record import Record
from gpugate.yamlio import read_cached, write_cached

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKS = os.path.join(os.path.dirname(_HERE), "checks")
# The code whose answer is cached: a changed schema or rule (an upgrade, an edit) is a miss.
# The check modules too (the check ids a site file may name are registered there), listed
# once, here: a command that must not list directories (`gpugate evidence`) may load a config.
_CODE = (
    os.path.join(_HERE, "__init__.py"),
    os.path.join(_HERE, "schema.py"),
    os.path.join(_HERE, "classes.py"),
    *sorted(os.path.join(_CHECKS, n) for n in os.listdir(_CHECKS) if n.endswith(".py")),
)


def _code() -> tuple[str, ...]:
    """The validating code's files: the loader, the schema and every check module."""
    return _CODE


def inputs(
    defaults_id: str, site_id: str, defaults: dict[str, object], site: dict[str, object]
) -> str | None:
    """What a Config is built from, described (the files by identity); None: do not cache."""
    try:
        code = ",".join(f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
                        for st in map(os.stat, _code()))  # fmt: skip
    except OSError:
        return None
    # Node classes pick by this node and the job's partition: part of the answer then.
    where = classes.this_node() if defaults.get("classes") or site.get("classes") else None
    return f"config-2 {__version__} {code} {defaults_id} {site_id} {where!r}"


def _key(described: str) -> tuple[str, tuple[int, int]]:
    raw = described.encode("utf-8", "surrogateescape")
    check = (len(raw), zlib.crc32(raw))
    return f"config-{check[1]:08x}-{check[0]:x}", check


def fetch(described: str | None) -> tuple[schema.Config, list[str]] | None:
    """The Config built before from exactly these inputs and its migration warnings, or None
    (build it, then `keep`)."""
    if described is None:
        return None
    key, check = _key(described)
    cached = read_cached(key, check)
    if cached is None:
        return None
    entry = cached[0]
    if not isinstance(entry, tuple) or len(entry) != 3 or entry[0] != described:
        return None
    warnings = entry[2]
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        return None
    try:
        config = _decode(entry[1])
    except (AttributeError, TypeError, ValueError):
        return None  # not what `keep` writes: build it
    return (config, warnings) if isinstance(config, schema.Config) else None


def keep(described: str | None, config: Record, warnings: list[str]) -> None:
    """Cache `config` as built from the inputs `described`, with the warnings its migration
    gave: every later run must say them again (best effort)."""
    if described is None:
        return
    try:
        encoded = _encode(config)
    except ValueError:
        return
    key, check = _key(described)
    write_cached(key, check, (described, encoded, list(warnings)))


def _encode(value: object) -> object:
    """Records as ("R", class name, {field: value}); lists, dicts and scalars as they are."""
    if isinstance(value, Record):
        fields = {f: _encode(getattr(value, f)) for f in value._fields}
        return ("R", type(value).__name__, fields)
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    raise ValueError(f"not cached: {type(value).__name__}")  # a tuple would read as a record


def _decode(value: object) -> object:
    """`_encode` undone: each record made as Record.__init__ would, its fields all given."""
    if type(value) is tuple:
        marker, name, fields = value
        cls = getattr(schema, name)
        if marker != "R" or not (isinstance(cls, type) and issubclass(cls, Record)):
            raise ValueError(name)
        if not isinstance(fields, dict) or list(fields) != list(cls._fields):
            raise ValueError(name)
        record = object.__new__(cls)
        # as Record.__init__ stores them: one dict, past the immutable __setattr__
        record.__dict__.update({k: _decode(v) for k, v in fields.items()})
        return record
    if type(value) is list:
        return [_decode(v) for v in value]
    if type(value) is dict:
        return {k: _decode(v) for k, v in value.items()}
    return value
