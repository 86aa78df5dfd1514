"""`torch.save` files judged by their end, and pickles read without unpickling.

A torch ZIP is complete when its central directory (written last) lists `<archive>/data.pkl`;
a legacy (before torch 1.6) file when its storages fill it to the byte; a plain pickle, by a
heuristic, when it ends with the STOP opcode. Ints such as `global_step` are found in the
pickle by their bytes. Only the file's end and the pickle's first few MiB are read.
"""

from __future__ import annotations

import io
import os
import struct

from gpugate.checkpoints.listing import Incomplete
from gpugate.userfiles import UserFileError, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

_TAIL = 64 * 1024 + 22  # the ZIP end record (22 bytes) plus the longest possible comment
_MAX_CENTRAL_DIR = 64 << 20  # ~100 bytes per tensor: room for 600k tensors
_MAX_PICKLE = 8 << 20  # how much of a pickle is read to find a step or storage sizes

_ZIP_LOCAL = b"PK\x03\x04"
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory: 22 bytes + comment
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, just before the EOCD
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # 56 bytes, where the locator says
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # one central directory header: 46 bytes + name, extra
# torch.save's legacy format starts with its magic number pickled alone (protocol 2).
_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."


def read_torch(path: str, keys: tuple[str, ...] = ()) -> tuple[float, dict[str, int], str, bool]:
    """Check a `torch.save` file by its end: (mtime, ints for `keys` in its pickle, what, proven).

    Proven: a ZIP's central directory and end record are written last, after every member; a
    legacy file whose storages fill it to the byte has nothing left to write. A plain pickle's
    STOP byte is only a heuristic.
    """
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        head = os.pread(fd, len(_LEGACY_MAGIC), 0)
        proven = True
        if head.startswith(_ZIP_LOCAL):
            what, ints = _check_zip(fd, st.st_size, keys)
        elif head.startswith(_LEGACY_MAGIC):
            what, ints = _check_legacy(fd, st.st_size, keys)
        elif head.startswith(b"\x80"):
            what, ints, proven = _check_pickle_end(fd, st.st_size), {}, False
        else:
            raise Incomplete("empty file" if not head else "neither a torch ZIP nor a pickle")
        return st.st_mtime, ints, what, proven
    finally:
        os.close(fd)


def torch_in(directory: str, rel: str, keys: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """`read_torch` on a file inside a checkpoint directory, naming it in the reason."""
    path = os.path.join(directory, rel)
    try:
        return read_torch(path, keys)
    except Incomplete as exc:
        raise Incomplete(f"{rel}: {exc}") from None
    except UserFileError as exc:
        raise Incomplete(str(exc).replace(path, rel)) from None


def _check_zip(fd: int, size: int, keys: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """A torch ZIP is complete when its central directory (written last) lists `*/data.pkl`."""
    count, data_pkl = _central_directory(fd, size)
    if data_pkl is None:
        raise Incomplete("a ZIP without <archive>/data.pkl: not a torch.save file")
    ints = _pickle_ints(_member_prefix(fd, data_pkl, _MAX_PICKLE), keys) if keys else {}
    return f"torch ZIP with an intact central directory ({count} entries)", ints


def _central_directory(fd: int, size: int) -> tuple[int, tuple[Any, ...] | None]:
    """Parse the ZIP end records and central directory: (entries, the data.pkl entry or None)."""
    # torch writes no ZIP comment, so the EOCD record is the last 22 bytes: read a little first,
    # and the longest possible comment's worth only when that fails.
    for want in (4096, _TAIL):
        tail_len = min(size, want)
        tail = os.pread(fd, tail_len, size - tail_len)
        at = _find_eocd(tail)
        if at >= 0 or tail_len == size:
            break
    if at < 0:
        raise Incomplete("truncated: no end-of-central-directory record (a ZIP ends with it)")
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    end = size - tail_len + at  # where the central directory must end
    if end >= 20 and os.pread(fd, 4, end - 20) == b"PK\x06\x07":
        # ZIP64 (over 4 GiB, over 65535 entries; Python writes it from 2 GiB): the locator
        # before the EOCD points at the ZIP64 end record, which holds the real numbers.
        _, _, record_at, _ = _ZIP64_LOCATOR.unpack(os.pread(fd, 20, end - 20))
        record = os.pread(fd, _ZIP64_EOCD.size, record_at)
        if len(record) < _ZIP64_EOCD.size or not record.startswith(b"PK\x06\x06"):
            raise Incomplete("ZIP64 end record missing where its locator points")
        *_, count, cd_size, cd_offset = _ZIP64_EOCD.unpack(record)
        end = record_at
    if cd_size > _MAX_CENTRAL_DIR or cd_size > end:
        raise Incomplete(f"central directory of {cd_size} bytes: implausible, not read")
    shift = end - cd_size - cd_offset  # bytes before the archive (0 for torch.save)
    return _parse_central(os.pread(fd, cd_size, end - cd_size), count, shift)


def _find_eocd(tail: bytes) -> int:
    """Where the EOCD record starts in `tail`: it ends the file (after its comment), or -1."""
    at = tail.rfind(b"PK\x05\x06")
    while at >= 0 and (at + 22 > len(tail) or at + 22 + _u16(tail, at + 20) != len(tail)):
        at = tail.rfind(b"PK\x05\x06", 0, at)  # an earlier match is payload bytes
    return at


def _parse_central(cd: bytes, count: int, shift: int) -> tuple[int, tuple[Any, ...] | None]:
    data_pkl, pos = None, 0
    try:
        for _ in range(count):
            h = _CENTRAL.unpack_from(cd, pos)
            if h[0] != b"PK\x01\x02":
                raise struct.error
            start, name_len, extra_len = pos + 46, h[10], h[11]
            name = cd[start : start + name_len].decode("utf-8", "replace")
            if data_pkl is None and name.endswith("/data.pkl") and name.count("/") == 1:
                size, offset = h[8], h[16]
                if 0xFFFFFFFF in (size, offset, h[9]):
                    extra = cd[start + name_len : start + name_len + extra_len]
                    size, offset = _zip64_extra(extra, h[9], size, offset)
                data_pkl = (name, h[4], size, offset + shift)
            pos = start + name_len + extra_len + h[12]
    except struct.error:
        raise Incomplete("the central directory is corrupt") from None
    if pos != len(cd):
        raise Incomplete("the central directory does not match its end record")
    return count, data_pkl


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int]:
    """Compressed size and offset from a ZIP64 extra field (only the maxed-out ones are there)."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = iter(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            usize = next(values) if usize == 0xFFFFFFFF else usize
            csize = next(values) if csize == 0xFFFFFFFF else csize
            offset = next(values) if offset == 0xFFFFFFFF else offset
            return csize, offset
        pos += 4 + length
    raise Incomplete("a ZIP64 entry without its extra field")


def _member_prefix(fd: int, member: tuple[Any, ...], limit: int) -> bytes:
    """Up to `limit` bytes of a stored (uncompressed, as torch writes) ZIP member."""
    name, method, size, offset = member
    if method != 0:
        return b""
    header = os.pread(fd, 30, offset)
    if len(header) < 30 or not header.startswith(_ZIP_LOCAL):
        raise Incomplete(f"{name}: local header missing: corrupt")
    name_len, extra_len = struct.unpack_from("<HH", header, 26)
    return os.pread(fd, min(size, limit), offset + 30 + name_len + extra_len)


def _u16(data: bytes, at: int) -> int:
    value: int = struct.unpack_from("<H", data, at)[0]
    return value


# --- pickles, read without unpickling -------------------------------------------------------

_PICKLE_INTS = {b"K": (1, False), b"M": (2, False), b"J": (4, True)}  # BININT1/2, BININT


def _pickle_ints(data: bytes, keys: tuple[str, ...]) -> dict[str, int]:
    """`{key: int}` for dict keys followed by an int in a pickle, found by their bytes.

    A string key is `X<len32>` (protocol 2, torch's default) or `\\x8c<len8>` (protocol 4+),
    maybe memoized (`q`, `r`, `\\x94`), then BININT1/BININT2/BININT/LONG1. The first match
    wins: the keys asked for are top-level keys that the frameworks put before any nested
    object that could hold the same name (and pickle writes a repeated string as a memo
    reference, not again).
    """
    found = {}
    for key in keys:
        raw = key.encode()
        for opener in (b"X" + struct.pack("<I", len(raw)), b"\x8c" + bytes([len(raw)])):
            at = data.find(opener + raw)
            while at >= 0 and key not in found:
                value = _int_at(data, at + len(opener) + len(raw))
                if value is not None:
                    found[key] = value
                at = data.find(opener + raw, at + 1)
    return found


def _int_at(data: bytes, at: int) -> int | None:
    at += {b"q": 2, b"r": 5, b"\x94": 1}.get(data[at : at + 1], 0)
    op = data[at : at + 1]
    if op in _PICKLE_INTS:
        width, signed = _PICKLE_INTS[op]
        raw = data[at + 1 : at + 1 + width]
        return int.from_bytes(raw, "little", signed=signed) if len(raw) == width else None
    if op == b"\x8a" and at + 1 < len(data):  # LONG1
        raw = data[at + 2 : at + 2 + data[at + 1]]
        return int.from_bytes(raw, "little", signed=True)
    return None


def _check_pickle_end(fd: int, size: int) -> str:
    """A plain pickle (not torch's format): accepted if its last byte is the STOP opcode.

    A heuristic: a pickle always ends with STOP (`.`), and a file cut at a random point ends
    with that byte only about once in 256 cuts. Only a full load would prove more.
    """
    if os.pread(fd, 1, size - 1) != b".":
        raise Incomplete("a pickle that does not end with the STOP opcode: cut short")
    return "a pickle ending with the STOP opcode (heuristic)"


# Bytes per element of the storage classes a legacy file names (`torch FloatStorage`, ...).
_ELEMENT_SIZE = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexDouble": 16, "ComplexFloat": 8, "QInt8": 1,
    "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1, "Untyped": 1,
}  # fmt: skip


def _check_legacy(fd: int, size: int, keys: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """Legacy `torch.save` (before 1.6): the storages' sizes must add up to the file's size.

    The format: pickles of the magic number, protocol version, sys_info, the object (storages
    as persistent ids with their type and element count), the sorted storage keys; then each
    storage as an int64 element count and its raw bytes. It has no end marker, and STOP is not
    its last byte (tensor data is), so the sizes are checked; the pickles are walked, not run.
    """
    import pickletools

    head = os.pread(fd, min(size, _MAX_PICKLE), 0)
    stream = io.BytesIO(head)
    try:
        for _ in range(3):  # magic number, protocol version, sys_info
            for _op in pickletools.genops(stream):
                pass
        storages = _legacy_storages(pickletools.genops(stream))
        order = [arg for op, arg, _ in pickletools.genops(stream) if isinstance(arg, str)]
        nbytes = sum(8 + storages[k][1] * _ELEMENT_SIZE[storages[k][0]] for k in order)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        if size > _MAX_PICKLE:
            raise Incomplete(
                f"legacy torch pickle over {_MAX_PICKLE >> 20} MiB: not checked"
            ) from None
        raise Incomplete("legacy torch pickle cut short or not understood") from None
    expected = stream.tell() + nbytes
    if expected != size:
        raise Incomplete(f"legacy torch file of {size} bytes; its storages need {expected}")
    return f"legacy torch pickle: {len(order)} storages fill it exactly", _pickle_ints(head, keys)


def _legacy_storages(ops: Iterable[Any]) -> dict[str, tuple[str, int]]:
    """`{key: (element type, count)}` of the storages a legacy torch pickle refers to.

    A small stack machine over pickletools' opcode table: it only keeps strings, ints, globals
    and tuples, enough to read the persistent ids `("storage", torch.<T>Storage, key, location,
    count, ...)`.
    """
    import pickletools

    mark: object = object()
    stack: list[Any] = []  # the unpickler's stack: whatever the opcodes push
    memo: dict[int, Any] = {}
    found: dict[str, tuple[str, int]] = {}

    def to_mark() -> list[Any]:
        i = len(stack) - 1 - stack[::-1].index(mark)
        items = stack[i + 1 :]
        del stack[i:]
        return items

    for op, arg, _ in ops:
        name = op.name
        if name == "MARK":
            stack.append(mark)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if arg is None else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name == "TUPLE":
            stack.append(tuple(to_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            stack[-n:] = [tuple(stack[-n:])]
        elif name == "STACK_GLOBAL":
            stack[-2:] = [f"{stack[-2]} {stack[-1]}"]
        elif name == "BINPERSID":
            pid = stack.pop()
            if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
                found[pid[2]] = (pid[1].split()[-1][: -len("Storage")], pid[4])
            stack.append(None)
        else:  # generic: pop what the opcode consumes, push placeholders (or its argument)
            before, after = op.stack_before, op.stack_after
            if pickletools.markobject in before:
                keep = before.index(pickletools.markobject)
                to_mark()
                del stack[len(stack) - keep :]
            elif before:
                del stack[-len(before) :]
            stack.extend([arg if not before else None] * len(after))
    return found
