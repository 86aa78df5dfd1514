"""What gpugate itself writes of the flight-recorder dumps: the reader child's answer and
`flightrec.json` in the bundle.

The dumps are PyTorch's (foreign input: gpugate.flightrec.reader turns each into a compact
record, a plain dict that gpugate.flightrec.culprit checks field by field). What crosses a
process or lands in a file around them is gpugate's own, and typed here: the answer of the
as-user child that read the dumps (hooks/flightrec_collect.read_dumps, run by
userfiles.as_user) is read with `from_json` before root uses it, and the bundle's
`flightrec.json` is written from, and read back into, `FlightrecFile`.
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class Refusal(JsonRecord):
    """A dump not read, or read and refused: its name and why (a refused one: size, sha256)."""

    name: str
    error: str
    bytes: int | None = None
    sha256: str | None = None

    _omit = frozenset({"bytes", "sha256"})
    _doc: ClassVar[dict[str, str]] = {
        "name": "the dump's file name (`*`: the whole collection)",
        "error": "why it was not read, or refused",
        "bytes": "a dump read and refused: its size (written only then)",
        "sha256": "a dump read and refused: the sha256 of its bytes (written only then)",
    }


class DumpsAnswer(JsonRecord):
    """The as-user reader child's answer: the dumps' compact records, refusals, kept data."""

    records: list[dict[str, Any]]
    errors: list[Refusal]
    kept: dict[str, Any] = {}
    kept_bytes: int = 0
    truncated: bool = False

    _doc: ClassVar[dict[str, str]] = {
        "records": "per accepted dump its compact record (gpugate.flightrec.reader.summarize, "
        "and `sha256`)",
        "errors": "the dumps not read or refused",
        "kept": "dump name -> its plain data, for `flightrec/<name>.json` (within the cap)",
        "kept_bytes": "the size of `kept` as JSON",
        "truncated": "a cap was reached: dumps, bytes, or a directory's listing",
    }


class FlightrecFile(JsonRecord):
    """`flightrec.json` in an evidence bundle: the dumps read on this node."""

    records: list[dict[str, Any]]
    errors: list[Refusal] = []
    searched: list[str] = []
    truncated: bool = False
    kept: list[str] = []
    note: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        "records": "per dump its compact record: `name`, `rank`, `node`, `version`, `pgs` "
        "{pg id: `name`, `desc`, `ranks`, `last_enqueued`, `last_started`, `last_completed`}, "
        "`entries` (the last 64 per group: `pg_id`, `seq`, `op`, `state`, times, `sizes`, "
        "`frame`), `notes`, `sha256` of the dump's bytes",
        "errors": "the dumps not read or refused (Refusal)",
        "searched": "the places looked at (`<dir>/<prefix>*`)",
        "truncated": "a cap was reached: dumps, bytes, or a directory's listing",
        "kept": "the `flightrec/<name>.json` members",
        "note": "the dumps were the user's pickles: never unpickle one",
    }


class Culprit(JsonRecord):
    """The rank a job's other ranks waited for, over its nodes' dumps (gpugate.flightrec.culprit).

    Three shapes, each with its own keys (`_omitted`): a decided finding (`ranks`, the process
    group, `op`, `seq`, `waiting_ranks`, and `calls` for a mismatch), `ambiguous` (`candidates`),
    and no culprit but refusals to say (state null: `rank`, `node`, `state`, `text`, `errors`).
    """

    rank: int | None
    ranks: list[int] | None = None
    node: str | None
    pg_id: str | None = None
    pg_name: str | None = None
    op: str | None = None
    seq: int | None = None
    state: str | None
    candidates: list[dict[str, Any]] | None = None
    waiting_ranks: list[int] | None = None
    ranks_seen: int | None = None
    text: str
    calls: dict[str, Any] | None = None
    errors: list[dict[str, Any]] | None = None

    _doc: ClassVar[dict[str, str]] = {
        "rank": "the culprit rank; null when several ranks or none are named",
        "ranks": "the ranks named (a decided finding)",
        "node": "the culprit rank's node (from the bundle's or decision record's node)",
        "pg_id": "the process group's id",
        "pg_name": "its description, else its name",
        "op": "the collective (null: not recorded, or an even mismatch)",
        "seq": "the collective's number in the group",
        "state": "`not_entered`, `in_collective`, `gone`, `mismatch`, `ambiguous`; null: no "
        "culprit, only refusals",
        "candidates": "`ambiguous`: the findings that name different ranks",
        "waiting_ranks": "the ranks that waited for it",
        "ranks_seen": "how many ranks sent a record",
        "text": "the finding in one line (the job's AdminComment, the diagnosis's summary)",
        "calls": "`mismatch`: per rank its `op` and `sizes`",
        "errors": "the dumps and bundles refused (`name`, `error`, and `node` where a dump's)",
    }

    _DECIDED_ONLY = frozenset({"ranks", "pg_id", "pg_name", "op", "seq", "waiting_ranks", "calls"})

    def _omitted(self) -> set[str] | frozenset[str]:
        if self.state is None:
            omit = self._DECIDED_ONLY | {"candidates", "ranks_seen"}
        elif self.state == "ambiguous":
            omit = self._DECIDED_ONLY
        else:
            omit = frozenset({"candidates"} | ({"calls"} if self.calls is None else set()))
        return omit | ({"errors"} if self.errors is None else set())
