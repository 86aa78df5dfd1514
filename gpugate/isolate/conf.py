"""One GPU out of one node's Slurm configuration, and back: slurm.conf and gres.conf as text.

What changes: slurm.conf's line for the node (`Gres=gpu:N` goes to N-1) and gres.conf's gpu
lines for the node (the GPU's device file leaves them); putting back does the reverse. Both
files change together because Slurm checks one against the other: a gres.conf that lists fewer
files than slurm.conf's count makes Slurm drain the node itself ("gres/gpu count reported lower
than configured (7 < 8)"), and `scontrol update NodeName=... Gres=gpu:7` is refused with
`File=` lines (docs/slurm-facts.md, "One GPU out of a node").

How: the node's own line is edited, never overridden by a second `NodeName=n1` line (Slurm:
"fatal: Duplicated NodeHostName"). A line whose hostlist covers other nodes too is split: the
original line keeps the others (written back as a compressed hostlist), and a line for this
node alone follows it. Every other line (other nodes, comments, blank lines, their order) is
left byte for byte. What gpugate cannot change safely raises Unsupported naming the file, the
line and why: then the caller drains the node as it always did.

Pure functions of the files' text; the only I/O is read_text() and write_conf().
"""

from __future__ import annotations

import os
import re
import stat

from gpugate.fsutil import MIB, FileRefused, atomic_write, read_regular
from gpugate.record import Record
from gpugate.slurm.hostlist import HostlistError, hostlist_compress, hostlist_expand

# Slurm's configuration files are small; a bigger one is not one gpugate should rewrite.
MAX_CONF_BYTES = 4 * MIB
# gres.conf keys (case-insensitive, as Slurm reads them: src/common/gres.c `_gres_options`).
# File/Files, Cores/CPUs and Link/Links are aliases.
_GRES_KEYS = frozenset(
    ("nodename", "name", "type", "file", "files", "cores", "cpus", "flags", "count", "links",
     "link", "multiplefiles", "autodetect")
)  # fmt: skip
# slurm.conf words whose hostlist pairs one to one with NodeName's (slurm.conf(5); Port= for
# several slurmd on one host): split along with it.
_PAIRED = ("nodename", "nodehostname", "nodeaddr", "bcastaddr", "port")
# The words a removed GPU's own line keeps: what Slurm binds to each file of its line alike.
_KEPT_WORDS = ("type", "cores", "cpus", "flags")


class Unsupported(ValueError):
    """The site's files have a shape gpugate will not change; str(exc) says what and where."""


class NodeGpus(Record):
    """A node's GPUs in Slurm's configuration: slurm.conf's count, gres.conf's files in order."""

    node: str
    count: int  # slurm.conf's Gres=gpu:N for the node
    files: tuple[str, ...]  # gres.conf's File= paths for the node's GPUs, expanded, in order


class _Word:
    """One `Key=Value` word of a line: where it is, so that it can be replaced in place."""

    def __init__(self, text: str, start: int) -> None:
        self.text, self.start, self.end = text, start, start + len(text)
        key, eq, value = text.partition("=")
        self.key = key.lower() if eq else ""
        self.value = value if eq else text
        self.value_start = self.start + len(key) + len(eq)


class _Line:
    """One physical line: its words (up to a comment), number (1-based), and line ending."""

    def __init__(self, raw: str, number: int, continued: bool) -> None:
        self.raw, self.number, self.continued = raw, number, continued
        self.words, self.comment_at = _scan(raw)

    def get(self, key: str) -> _Word | None:
        """The first word with this (lower-case) key."""
        return next((w for w in self.words if w.key == key), None)

    @property
    def first_key(self) -> str:
        return self.words[0].key if self.words else ""


def _scan(raw: str) -> tuple[list[_Word], int]:
    """The words of a line and where its comment starts (`#` outside quotes, not `\\#`)."""
    words: list[_Word] = []
    start, quoted = -1, False
    end = len(raw)
    for i, ch in enumerate(raw):
        if ch == '"':
            quoted = not quoted
        if ch == "#" and not quoted and (i == 0 or raw[i - 1] != "\\"):
            end = i
            break
        if ch.isspace() and not quoted:
            if start >= 0:
                words.append(_Word(raw[start:i], start))
                start = -1
        elif start < 0:
            start = i
    if start >= 0:
        words.append(_Word(raw[start:end], start))
    return words, end


def _lines(text: str) -> list[_Line]:
    """The file's physical lines (split on "\\n" only, so that joining gives the text back)."""
    raws = text.split("\n")
    out = []
    for i, raw in enumerate(raws):
        # Slurm joins a line ending in `\` with the next one; gpugate does not edit those.
        before = i > 0 and raws[i - 1].rstrip().endswith("\\")
        out.append(_Line(raw, i + 1, before or raw.rstrip().endswith("\\")))
    return out


def _replace(raw: str, edits: list[tuple[int, int, str]]) -> str:
    """`raw` with each (start, end, new) span replaced (spans do not overlap)."""
    for start, end, new in sorted(edits, reverse=True):
        raw = raw[:start] + new + raw[end:]
    return raw


def _expand(line: _Line, word: _Word, where: str) -> list[str]:
    try:
        return hostlist_expand(word.value)
    except HostlistError as exc:
        raise Unsupported(f"{where} line {line.number}: cannot read {word.text}: {exc}") from None


def _compress(names: list[str], where: str, line: _Line) -> str:
    try:
        return hostlist_compress(names)
    except HostlistError as exc:
        raise Unsupported(f"{where} line {line.number}: {exc}") from None


def _refuse_continued(line: _Line, where: str) -> None:
    if line.continued:
        raise Unsupported(
            f"{where} line {line.number}: continued with '\\' (gpugate edits single lines only)"
        )


def _includes(lines: list[_Line]) -> str:
    has = any(ln.words and ln.words[0].text.lower() == "include" for ln in lines)
    return " (Include files are not followed" + (", and this file has some)" if has else ")")


# slurm.conf --------------------------------------------------------------------------------


class _NodeLine(Record):
    """The node's line in slurm.conf, its hostlist, and its Gres= word's gpu entry."""

    index: int  # into the list of lines
    names: list[str]  # NodeName= expanded
    entries: list[str]  # Gres= split on commas
    gpu: int  # which entry is the gpu one
    count: int


def _node_line(lines: list[_Line], node: str, where: str) -> _NodeLine:
    found: list[tuple[int, list[str]]] = []
    default_gres: _Line | None = None
    for i, line in enumerate(lines):
        if line.first_key != "nodename":
            continue
        word = line.words[0]
        if word.value.lower() == "default":
            gres = line.get("gres")
            if gres is not None:
                default_gres = line if gres.value else None
            continue
        names = _expand(line, word, where)
        if node in names:
            if not line.get("gres") and default_gres is not None:
                raise Unsupported(
                    f"{where} line {line.number}: node {node} takes its Gres= from "
                    f"NodeName=DEFAULT (line {default_gres.number}); gpugate edits a node's "
                    "own Gres= only"
                )
            found.append((i, names))
    if not found:
        raise Unsupported(f"{where}: no NodeName= line for node {node}{_includes(lines)}")
    if len(found) > 1:
        numbers = ", ".join(str(lines[i].number) for i, _ in found)
        raise Unsupported(f"{where}: node {node} is on several NodeName= lines ({numbers})")
    index, names = found[0]
    line = lines[index]
    _refuse_continued(line, where)
    gres = line.get("gres")
    entries = gres.value.split(",") if gres else []
    gpus = [k for k, e in enumerate(entries) if e.split(":")[0].lower() == "gpu"]
    if not gpus:
        raise Unsupported(f"{where} line {line.number}: no gpu in node {node}'s Gres=")
    if len(gpus) > 1:
        raise Unsupported(
            f"{where} line {line.number}: several gpu entries in {gres.text if gres else ''} "
            "(gpugate changes a single gpu count)"
        )
    parts = entries[gpus[0]].split(":")
    if len(parts) not in (2, 3) or not parts[-1].isdigit() or '"' in entries[gpus[0]]:
        raise Unsupported(
            f"{where} line {line.number}: cannot read the gpu count in {entries[gpus[0]]!r} "
            "(gpu:N or gpu:TYPE:N)"
        )
    return _NodeLine(index=index, names=names, entries=entries, gpu=gpus[0], count=int(parts[-1]))


def _set_count(slurm_conf: str, node: str, delta: int, where: str) -> str:
    """slurm.conf with the node's gpu count changed by `delta`, its line split if shared."""
    lines = _lines(slurm_conf)
    found = _node_line(lines, node, where)
    line = lines[found.index]
    parts = found.entries[found.gpu].split(":")
    parts[-1] = str(found.count + delta)
    entries = list(found.entries)
    entries[found.gpu] = ":".join(parts)
    gres = line.get("gres")
    assert gres is not None  # _node_line found a gpu entry in it
    content = line.raw[: line.comment_at].rstrip()
    if found.names == [node]:
        line.raw = _replace(line.raw, [(gres.value_start, gres.end, ",".join(entries))])
        return "\n".join(ln.raw for ln in lines)
    # A shared line: the others keep the original line, the node gets one of its own.
    pos = found.names.index(node)
    keep: list[tuple[int, int, str]] = []
    own: list[tuple[int, int, str]] = [(gres.value_start, gres.end, ",".join(entries))]
    for word in line.words:
        if word.key in _PAIRED:
            values = found.names if word.key == "nodename" else _expand(line, word, where)
            if len(values) == 1 and word.key != "nodename":
                continue  # one value for all of them stays as it is
            if len(values) != len(found.names):
                raise Unsupported(
                    f"{where} line {line.number}: {word.text} does not pair one to one "
                    f"with NodeName={line.words[0].value}"
                )
            rest = [v for k, v in enumerate(values) if k != pos]
            keep.append((word.value_start, word.end, _compress(rest, where, line)))
            own.append((word.value_start, word.end, values[pos]))
    new_line = _replace(content, own)
    ending = "\r" if line.raw.endswith("\r") and not new_line.endswith("\r") else ""
    line.raw = _replace(line.raw, keep)
    out = [ln.raw for ln in lines]
    out.insert(found.index + 1, new_line + ending)
    return "\n".join(out)


# gres.conf ---------------------------------------------------------------------------------


class _GresLine(Record):
    """One gres.conf line for the node: its index, nodes, gres name and files."""

    index: int
    nodes: list[str]
    name: str  # lower case
    files: list[str]


def _gres_lines(lines: list[_Line], node: str, where: str) -> list[_GresLine]:
    """Every gres.conf line for the node; Unsupported where the node's GPUs are not plain."""
    out: list[_GresLine] = []
    auto: list[tuple[_Line, str]] = []  # global AutoDetect lines
    local: list[tuple[_Line, str]] = []  # AutoDetect on lines for the node
    for i, line in enumerate(lines):
        if not line.words:
            continue
        first = line.first_key
        if first == "autodetect":
            auto.append((line, line.words[0].value))
            continue
        later = [w for w in line.words[1:] if w.key == "nodename"]
        if later:
            raise Unsupported(f"{where} line {line.number}: NodeName= must come first")
        name_word = line.get("name")
        name = name_word.value.lower() if name_word else ""
        if first != "nodename":
            if name == "gpu":
                raise Unsupported(
                    f"{where} line {line.number}: a gpu line without NodeName= applies to "
                    "every node that reads this file; gpugate changes one node's lines only"
                )
            continue
        nodes = _expand(line, line.words[0], where)
        if node not in nodes:
            continue
        detect = line.get("autodetect")
        if detect is not None:
            local.append((line, detect.value))
        file_word = line.get("file") or line.get("files") or line.get("multiplefiles")
        files = _expand(line, file_word, where) if file_word else []
        if name:
            out.append(_GresLine(index=i, nodes=nodes, name=name, files=files))
    # Slurm: a node's own AutoDetect wins over the global one (gres.c
    # `_handle_global_autodetect`). Anything but `off` (nvml, nvidia, rsmi, oneapi, nrt, a
    # word a later Slurm adds) may find the GPU again.
    for line, value in local or auto:
        if value.lower() == "off":
            continue
        raise Unsupported(
            f"{where} line {line.number}: AutoDetect={value} finds the GPU again "
            "(only File= lines with AutoDetect=off can leave a GPU out)"
        )
    return out


def _gpu_lines(lines: list[_Line], node: str, where: str) -> list[_GresLine]:
    gpus = [g for g in _gres_lines(lines, node, where) if g.name == "gpu"]
    if not gpus:
        raise Unsupported(f"{where}: no gpu line for node {node}{_includes(lines)}")
    for g in gpus:
        line = lines[g.index]
        if line.get("file") is None and line.get("files") is None:
            what = "MultipleFiles=" if line.get("multiplefiles") else "no File="
            raise Unsupported(
                f"{where} line {line.number}: {what} (gpugate needs one File= path per GPU)"
            )
    return gpus


def read_node_gpus(
    slurm_conf: str, gres_conf: str, node: str, *, slurm_name: str = "slurm.conf",
    gres_name: str = "gres.conf",
) -> NodeGpus:  # fmt: skip
    """The node's gpu count (slurm.conf) and GPU files (gres.conf); Unsupported if they differ."""
    count = _node_line(_lines(slurm_conf), node, slurm_name).count
    files = tuple(f for g in _gpu_lines(_lines(gres_conf), node, gres_name) for f in g.files)
    if count != len(files):
        raise Unsupported(
            f"{slurm_name} gives node {node} Gres=gpu:{count} but {gres_name} lists "
            f"{len(files)} gpu file(s): gpugate changes only a configuration that agrees"
        )
    if len(set(files)) != len(files):
        raise Unsupported(f"{gres_name}: node {node} lists a gpu file twice")
    return NodeGpus(node=node, count=count, files=files)


def gpu_file(gpus: NodeGpus, minor: int) -> str:
    """The File= path of the GPU whose device minor is `minor` (basename exactly nvidia<minor>);
    Unsupported if none or several."""
    want = f"nvidia{int(minor)}"
    found = [f for f in gpus.files if os.path.basename(f) == want]
    if len(found) != 1:
        how = "none" if not found else f"several ({', '.join(found)})"
        raise Unsupported(f"gres.conf: node {gpus.node}: {how} of its gpu files is {want}")
    return found[0]


def take_out(
    slurm_conf: str, gres_conf: str, node: str, path: str, *, slurm_name: str = "slurm.conf",
    gres_name: str = "gres.conf",
) -> tuple[str, str, str]:  # fmt: skip
    """(new slurm.conf, new gres.conf, the removed GPU's own gres.conf line to put back later).
    The node's count goes down by one, `path` leaves the node's gres lines; other nodes and
    every other line (comments, blank lines, order) are unchanged."""
    gpus = read_node_gpus(slurm_conf, gres_conf, node, slurm_name=slurm_name, gres_name=gres_name)
    if path not in gpus.files:
        raise Unsupported(f"{gres_name}: {path} is not one of node {node}'s gpu files")
    if gpus.count <= 1:
        raise Unsupported(
            f"{slurm_name}: node {node} has Gres=gpu:{gpus.count}: no GPU would be left "
            "(the node is drained instead)"
        )
    lines = _lines(gres_conf)
    for g in _gres_lines(lines, node, gres_name):
        if g.name != "gpu" and path in g.files:
            raise Unsupported(
                f"{gres_name} line {lines[g.index].number}: Name={g.name} uses {path} too "
                "(it would still hand the GPU out)"
            )
    g = next(g for g in _gpu_lines(lines, node, gres_name) if path in g.files)
    line = lines[g.index]
    _refuse_continued(line, gres_name)
    for word in line.words:
        if word.key in ("links", "link"):
            raise Unsupported(
                f"{gres_name} line {line.number}: {word.text} is positional per GPU "
                "(gpugate does not renumber it)"
            )
        if word.key not in _GRES_KEYS:
            raise Unsupported(f"{gres_name} line {line.number}: unknown word {word.text!r}")
    removed = " ".join(
        [f"NodeName={node}", "Name=gpu", f"File={path}"]
        + [w.text for w in line.words if w.key in _KEPT_WORDS]
    )
    rest = [f for f in g.files if f != path]
    edits = _without(line, node, g, rest, gres_name) if rest else None
    out = [ln.raw for ln in lines]
    if g.nodes == [node]:
        if edits is None:
            del out[g.index]  # the line listed this GPU alone
        else:
            out[g.index] = _replace(line.raw, edits)  # its comment stays
    else:
        others = [n for n in g.nodes if n != node]
        head = line.words[0]
        out[g.index] = _replace(
            line.raw, [(head.value_start, head.end, _compress(others, gres_name, line))]
        )
        if edits is not None:  # the node's own copy, without the shared line's comment
            ending = "\r" if line.raw.endswith("\r") else ""
            out.insert(g.index + 1, _replace(line.raw[: line.comment_at], edits).rstrip() + ending)
    new_slurm = _set_count(slurm_conf, node, -1, slurm_name)
    return new_slurm, "\n".join(out), removed


def _without(
    line: _Line, node: str, g: _GresLine, rest: list[str], where: str
) -> list[tuple[int, int, str]]:
    """The edits that make a gres line the node's own, listing only the files `rest`."""
    edits: list[tuple[int, int, str]] = []
    for word in line.words:
        if word.key == "nodename":
            edits.append((word.value_start, word.end, node))
        elif word.key in ("file", "files"):
            edits.append((word.value_start, word.end, _compress(rest, where, line)))
        elif word.key == "count":
            if not word.value.isdigit() or int(word.value) != len(g.files):
                raise Unsupported(
                    f"{where} line {line.number}: {word.text} does not match its "
                    f"{len(g.files)} files"
                )
            edits.append((word.value_start, word.end, str(len(rest))))
    return edits


def put_back(
    slurm_conf: str, gres_conf: str, node: str, line: str, *, slurm_name: str = "slurm.conf",
    gres_name: str = "gres.conf",
) -> tuple[str, str]:  # fmt: skip
    """The reverse: count up by one, `line` (as take_out returned it) back where its device
    belongs among the node's gpu lines. Refuses (Unsupported) if its file is already listed.

    Where: with AutoDetect=off Slurm numbers a node's GPUs in gres.conf's order (docs/
    slurm-facts.md, "Slurm's GPU indices"), so the file goes back at its place by device
    minor (after the node's last file with a lower one): into the line take_out split (its
    range whole again) or next to a line of several files with the same words, else as a line
    of its own. A node whose files were in ascending order before take_out gets them so back,
    and its gres.conf lines as they were (a range line, or one line per device)."""
    parsed = _put_back_line(line, node)
    file = parsed.get("file")
    assert file is not None  # _put_back_line checked
    gpus = read_node_gpus(slurm_conf, gres_conf, node, slurm_name=slurm_name, gres_name=gres_name)
    if file.value in gpus.files:
        raise Unsupported(f"{gres_name}: {file.value} is already listed for node {node}")
    lines = _lines(gres_conf)
    node_lines = _gpu_lines(lines, node, gres_name)
    out = [ln.raw for ln in lines]
    place = _place(node_lines, file.value)
    if place is None:  # a file without a device number: after the node's last gpu line
        after = lines[max(g.index for g in node_lines)]
        _refuse_continued(after, gres_name)  # a line after a `\` would join it
        out.insert(after.number, line + _ending(after))
        return _set_count(slurm_conf, node, +1, slurm_name), "\n".join(out)
    before, following = place
    kept = _kept(parsed)
    inside = before is not None and following is not None and before[0] is following[0]
    merge: tuple[_GresLine, int] | None = None
    if inside:  # take_out split this line's files: the file goes back into them
        assert before is not None
        merge = (before[0], before[1] + 1) if _joins(lines, before[0], node, kept) else None
    else:  # a boundary: a line of several files takes it (a range), a per-device line not
        for side, at in ((before, 1), (following, 0)):
            if side is not None and len(side[0].files) > 1 and _joins(lines, side[0], node, kept):
                merge = (side[0], side[1] + at)
                break
    if merge is not None:
        g, k = merge
        files = [*g.files[:k], file.value, *g.files[k:]]
        target = lines[g.index]
        _refuse_continued(target, gres_name)
        out[g.index] = _replace(target.raw, _with_files(target, files, gres_name))
    elif inside:  # the line around it has other words: split it, the file between the halves
        assert before is not None
        g, k = before[0], before[1] + 1
        target = lines[g.index]
        _refuse_continued(target, gres_name)
        if g.nodes != [node]:
            raise Unsupported(
                f"{gres_name} line {target.number}: {file.value} would go inside a line shared "
                "with other nodes"
            )
        content, ending = target.raw[: target.comment_at].rstrip(), _ending(target)
        head = _replace(target.raw, _with_files(target, g.files[:k], gres_name))
        tail = _replace(content, _with_files(target, g.files[k:], gres_name)) + ending
        out[g.index : g.index + 1] = [head, line + ending, tail]
    else:
        # Its own line: after the line of the file before it, else before the line after it.
        if before is not None:
            at = before[0].index + 1
            _refuse_continued(lines[before[0].index], gres_name)
            ending = _ending(lines[before[0].index])
        else:
            assert following is not None
            at = following[0].index
            ending = _ending(lines[following[0].index])
            if at > 0:
                _refuse_continued(lines[at - 1], gres_name)
        out.insert(at, line + ending)
    return _set_count(slurm_conf, node, +1, slurm_name), "\n".join(out)


def _put_back_line(line: str, node: str) -> _Line:
    """The line to put back, parsed; Unsupported unless it is one take_out writes."""
    if "\n" in line or "\r" in line:
        raise Unsupported(f"put back: one gres.conf line expected, got {line!r}")
    parsed = _Line(line, 0, False)
    if parsed.comment_at != len(line):
        raise Unsupported(f"put back: a comment in the line {line!r}")
    keys = [w.key for w in parsed.words]
    head, name, file = parsed.get("nodename"), parsed.get("name"), parsed.get("file")
    if (
        keys[:3] != ["nodename", "name", "file"]
        or not set(keys[3:]) <= set(_KEPT_WORDS)
        or head is None
        or head.value != node
        or name is None
        or name.value.lower() != "gpu"
        or file is None
    ):
        raise Unsupported(
            f"put back: {line!r} is not a gpu line for node {node} as take_out writes it"
        )
    try:
        path_ok = hostlist_expand(file.value) == [file.value]
    except HostlistError:
        path_ok = False
    if not path_ok:
        raise Unsupported(f"put back: {file.text} is not a single path")
    return parsed


def _device_number(path: str) -> int | None:
    """The trailing digits of a device file's name (Slurm's dev_num: gres.c
    `_init_gres_device`), None without."""
    digits = re.search(r"(\d+)$", os.path.basename(path))
    return int(digits.group(1)) if digits else None


_Spot = tuple[_GresLine, int]  # a node gpu line and a place in its files


def _place(node_lines: list[_GresLine], path: str) -> tuple[_Spot | None, _Spot | None] | None:
    """Where `path` goes among the node's files in file order: (the file before it, the file
    after it), each as (line, place in it); None when a file has no device number."""
    want = _device_number(path)
    spots = [(g, k) for g in node_lines for k in range(len(g.files))]
    numbers = [_device_number(g.files[k]) for g, k in spots]
    if want is None or any(n is None for n in numbers):
        return None
    # After the last file with a lower number: ascending files stay ascending, and in any
    # other order the file still follows its nearest lower neighbour as listed.
    lower = [i for i, n in enumerate(numbers) if n is not None and n < want]
    i = max(lower, default=-1)
    before = spots[i] if i >= 0 else None
    following = spots[i + 1] if i + 1 < len(spots) else None
    return before, following


def _kept(line: _Line) -> dict[str, str]:
    """The words a GPU's own line keeps (_KEPT_WORDS), by lower-case key."""
    return {w.key: w.value for w in line.words if w.key in _KEPT_WORDS}


def _joins(lines: list[_Line], g: _GresLine, node: str, kept: dict[str, str]) -> bool:
    """Whether the put-back file can join line `g`: the node's own, the same kept words, and
    nothing positional per file in it (Links)."""
    line = lines[g.index]
    plain = {"nodename", "name", "file", "files", "count", *_KEPT_WORDS}
    if g.nodes != [node] or any(w.key not in plain for w in line.words):
        return False
    return _kept(line) == kept


def _with_files(line: _Line, files: list[str], where: str) -> list[tuple[int, int, str]]:
    """The edits that make a gres line list `files` (its File= and any Count=)."""
    edits: list[tuple[int, int, str]] = []
    for word in line.words:
        if word.key in ("file", "files"):
            edits.append((word.value_start, word.end, _compress(files, where, line)))
        elif word.key == "count":
            edits.append((word.value_start, word.end, str(len(files))))
    return edits


def _ending(line: _Line) -> str:
    return "\r" if line.raw.endswith("\r") else ""


# files -------------------------------------------------------------------------------------


def read_text(path: str) -> str:
    """A Slurm configuration file's text; Unsupported for a symlink, a non-regular file, one
    over MAX_CONF_BYTES or one that is not UTF-8 (gpugate writes back what it reads); the
    open's own OSError (naming the path) for a missing or unreadable one."""
    try:
        data = read_regular(path, MAX_CONF_BYTES, follow=False)
    except FileRefused as exc:
        raise Unsupported(f"{path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unsupported(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def write_conf(path: str, text: str) -> None:
    """Atomic replace (temp file in the same directory, fsync, rename), keeping the file's
    mode, owner and group; refuses a symlink or a non-regular file (Unsupported)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Unsupported(f"{path}: a symlink; gpugate does not write through it")
    if not stat.S_ISREG(st.st_mode):
        raise Unsupported(f"{path}: not a regular file; not written")
    # atomic_write never follows a symlink for its temporary file, and the rename replaces
    # whatever is at `path` then (a symlink planted since the lstat is replaced, not followed).
    atomic_write(path, text, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)  # the rename itself reaches the disk
    finally:
        os.close(directory)
