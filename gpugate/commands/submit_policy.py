"""`gpugate submit-policy`: the checkpoint policy at submission, as Slurm's job_submit.lua.

`--lua` writes the Lua plugin with the `submit:` thresholds of gpugate.yaml baked in (the
template is gpugate/job_submit.lua.in), so slurmctld never runs Python per submission. Without
`--lua` it prints the policy in words. Install the Lua as job_submit.lua beside slurm.conf and
set `JobSubmitPlugins=lua`.
"""

from __future__ import annotations

import os
import sys

from gpugate.cli import EXIT_OK, EXIT_USAGE, make_parser
from gpugate.config import load_config
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Submit

TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "job_submit.lua.in")
_MARKER = "-- @POLICY@ (replaced by `gpugate submit-policy --lua`)"
# A partition name Slurm accepts, so that a typo'd key cannot smuggle Lua into the table.
_PARTITION = lazy(r"[A-Za-z0-9_.\-]{1,64}")


def lua_string(text: str) -> str:
    """`text` as a Lua string literal (any byte but the plain printable ones escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\' or byte < 32 or byte > 126:
            out.append(f"\\{byte}")  # Lua 5.1 reads \ddd as a decimal byte
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def policy_table(submit: Submit) -> str:
    """The `GPUGATE_POLICY = {...}` Lua block of a `submit:` config section."""
    lines = [
        "GPUGATE_POLICY = {",
        f"\tmin_gpus = {int(submit.min_gpus)},",
        f"\tmin_nodes = {int(submit.min_nodes)},",
        f"\tallow_opt_out = {'true' if submit.allow_opt_out else 'false'},",
        f"\tmessage = {lua_string(submit.message)},",
        "\tpartitions = {",
    ]
    for name, over in sorted(submit.partitions.items()):
        fields = [
            f"{key} = {int(value)}"
            for key, value in (("min_gpus", over.min_gpus), ("min_nodes", over.min_nodes))
            if value is not None
        ]
        lines.append(f"\t\t[{lua_string(name)}] = {{ {', '.join(fields)} }},")
    lines += ["\t},", "}"]
    return "\n".join(lines)


def render_lua(submit: Submit, template: str | None = None) -> str:
    """The whole job_submit.lua for a `submit:` section."""
    if template is None:
        with open(TEMPLATE, encoding="utf-8") as f:
            template = f.read()
    if template.count(_MARKER) != 1:
        raise ValueError(f"{TEMPLATE}: the policy marker line is missing or repeated")
    return template.replace(_MARKER, policy_table(submit))


def check_partitions(submit: Submit) -> str | None:
    """An error naming a partition key Slurm would never accept, else None."""
    for name in submit.partitions:
        if not _PARTITION.fullmatch(name):
            return f"submit.partitions: {name!r} is not a Slurm partition name"
    return None


def describe(submit: Submit) -> str:
    """The policy in words, for the admin."""
    parts = []
    if submit.min_gpus:
        parts.append(f"{submit.min_gpus} GPUs")
    if submit.min_nodes:
        parts.append(f"{submit.min_nodes} nodes")
    lines = [
        "jobs of " + " or ".join(parts) + " or more must declare --comment gpugate:ckpt=DIR"
        if parts
        else "no size threshold: no job is refused (outside the partitions below)"
    ]
    for name, over in sorted(submit.partitions.items()):
        lines.append(f"  partition {name}: min_gpus={over.min_gpus} min_nodes={over.min_nodes}")
    opt = "allowed" if submit.allow_opt_out else "not allowed"
    lines.append(f"opting out with gpugate:no-ckpt: {opt}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the policy, or write it as job_submit.lua (`--lua`)."""
    parser = make_parser("gpugate submit-policy", __doc__.splitlines()[0])
    parser.add_argument("--config", help="site gpugate.yaml (default: $GPUGATE_CONFIG, /etc)")
    parser.add_argument("--lua", action="store_true", help="write the job_submit.lua plugin")
    parser.add_argument("-o", "--output", help="write the Lua here (default: standard output)")
    args = parser.parse_args(argv)
    submit = load_config(args.config).submit
    problem = check_partitions(submit)
    if problem:
        print(f"gpugate submit-policy: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if not args.lua:
        print(describe(submit))
        return EXIT_OK
    text = render_lua(submit)
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    tmp = f"{args.output}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.output)  # slurmctld re-reads it on each submission: never half
    except OSError as exc:
        print(f"gpugate submit-policy: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
