"""Drop directory entries from a built .deb's data.tar.xz, so the package does not own them.

`python3 unown_dirs.py PACKAGE.deb ./opt/ ...` rewrites PACKAGE.deb in place (packaging/deb/
build.sh runs it). dpkg-deb lists every directory of the package's root, and dpkg counts each
listed directory as the package's. No package owns /opt (base-files' postinst creates it, on
every Debian and Ubuntu system), so dpkg took /opt for gpugate's alone: removing or purging
gpugate then tried to remove /opt itself and warned "directory '/opt' not empty so not
removed". Without the entry, dpkg unpacks /opt/gpugate into the /opt that is there and, on
removal, removes /opt/gpugate and leaves /opt alone.

Only whole 512-byte header blocks of empty directory entries are cut out (and as many zero
blocks added at the end); every other byte of dpkg-deb's archive is kept. Standard library only (the build host's Python).
"""

from __future__ import annotations

import io
import lzma
import sys
import tarfile

AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60  # name 16, mtime 12, uid 6, gid 6, mode 8, size 10, "`\n" 2
TAR_BLOCK = 512


def read_ar(data: bytes) -> list[tuple[bytes, bytes]]:
    """The members of an ar archive as (60-byte header, content), in order."""
    if not data.startswith(AR_MAGIC):
        raise ValueError("not an ar archive (a .deb)")
    members, pos = [], len(AR_MAGIC)
    while pos < len(data):
        header = data[pos : pos + AR_HEADER]
        if len(header) != AR_HEADER or header[58:60] != b"`\n":
            raise ValueError(f"bad ar member header at byte {pos}")
        size = int(header[48:58].decode("ascii"))
        start = pos + AR_HEADER
        members.append((header, data[start : start + size]))
        pos = start + size + (size % 2)  # members are padded to an even length
    return members


def write_ar(members: list[tuple[bytes, bytes]]) -> bytes:
    """An ar archive of (header, content) members; each header's size field is set anew."""
    out = [AR_MAGIC]
    for header, content in members:
        out.append(header[:48] + str(len(content)).encode("ascii").ljust(10) + header[58:])
        out.append(content + (b"\n" if len(content) % 2 else b""))
    return b"".join(out)


def drop_entries(tar: bytes, names: set[str]) -> bytes:
    """TAR without the empty directory entries NAMES; refuses any other kind of entry."""
    cuts = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        for member in archive.getmembers():
            if member.name + "/" not in names and member.name not in names:
                continue
            # A single header block: no long-name or pax header before it, no content after.
            if not member.isdir() or member.offset_data - member.offset != TAR_BLOCK:
                raise ValueError(f"{member.name}: not a plain directory entry")
            cuts.append(member.offset)
    found = len(cuts)
    if found != len(names):
        raise ValueError(f"expected {len(names)} entries of {sorted(names)}, found {found}")
    for offset in sorted(cuts, reverse=True):
        tar = tar[:offset] + tar[offset + TAR_BLOCK :]
    # As long as before (tar's record size): zero blocks after the end-of-archive ones.
    return tar + bytes(TAR_BLOCK * found)


def unown(deb: bytes, names: set[str]) -> bytes:
    """DEB with NAMES dropped from its data.tar.xz (built with dpkg-deb -Zxz)."""
    members = read_ar(deb)
    for index, (header, content) in enumerate(members):
        if header[:16].decode("ascii").rstrip(" /") == "data.tar.xz":
            tar = drop_entries(lzma.decompress(content), names)
            members[index] = (header, lzma.compress(tar, preset=6, check=lzma.CHECK_CRC64))
            return write_ar(members)
    raise ValueError("no data.tar.xz member (build with dpkg-deb -Zxz)")


def main(argv: list[str]) -> int:
    """Rewrite the .deb ARGV[0] without the directory entries ARGV[1:]."""
    if len(argv) < 2:
        print("usage: unown_dirs.py PACKAGE.deb ./DIR/ ...", file=sys.stderr)
        return 2
    path, names = argv[0], set(argv[1:])
    with open(path, "rb") as fh:
        deb = fh.read()
    try:
        new = unown(deb, names)
    except (ValueError, tarfile.TarError, lzma.LZMAError) as exc:
        print(f"unown_dirs.py: {path}: {exc}", file=sys.stderr)
        return 1
    with open(path, "wb") as fh:
        fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
