"""`gpugate submit-policy` and its job_submit.lua: the config section, the rendering, and the
Lua's decisions (run under a real Lua interpreter when one is on PATH)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from gpugate.cli import main as cli
from gpugate.commands.submit_policy import lua_string, render_lua
from gpugate.config import ConfigError, load_config
from gpugate.slurm.hookenv import comment_tokens

LUA = next(
    (shutil.which(n) for n in ("lua5.1", "luajit", "lua5.3", "lua") if shutil.which(n)), None
)
needs_lua = pytest.mark.skipif(LUA is None, reason="no lua interpreter on PATH")


def site(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpugate.yaml"
    path.write_text(text)
    return path


def submit(tmp_path: Path, text: str = "{}"):
    return load_config(str(site(tmp_path, text))).submit


def test_packaged_defaults(tmp_path: Path) -> None:
    s = submit(tmp_path)
    assert (s.min_gpus, s.min_nodes, s.partitions, s.allow_opt_out) == (16, 2, {}, True)


@pytest.mark.parametrize(
    "text, error",
    [
        ("submit: {min_gpus: -1}", "submit.min_gpus: must not be negative"),
        ("submit: {min_nodes: two}", "submit.min_nodes: expected int"),
        ("submit: {partitions: {gpu: {min_gpu: 8}}}", "min_gpu: unknown key"),
        ("submit: {allow_opt_out: 1}", "submit.allow_opt_out: expected bool"),
        ("submit: {threshold: 8}", "submit.threshold: unknown key"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        submit(tmp_path, text)


def test_lua_string_escapes_everything_but_plain_text() -> None:
    assert lua_string('a "b" \\ é\n') == '"a \\34b\\34 \\92 \\195\\169\\10"'


def test_rendered_lua_bakes_in_the_site_values(tmp_path: Path) -> None:
    s = submit(tmp_path, "submit: {min_gpus: 32, partitions: {big: {min_nodes: 4}}}")
    text = render_lua(s)
    assert "min_gpus = 32," in text and '["big"] = { min_nodes = 4 },' in text
    assert "@POLICY@" not in text
    with pytest.raises(ValueError, match="marker"):
        render_lua(s, template="-- no marker")


def test_cli_writes_the_lua_and_describes_the_policy(tmp_path: Path, capsys) -> None:
    conf = site(tmp_path, "submit: {min_gpus: 8, allow_opt_out: false}")
    out = tmp_path / "job_submit.lua"
    assert cli(["submit-policy", "--config", str(conf), "--lua", "-o", str(out)]) == 0
    assert "min_gpus = 8," in out.read_text() and "allow_opt_out = false," in out.read_text()
    assert cli(["submit-policy", "--config", str(conf)]) == 0
    assert "jobs of 8 GPUs or 2 nodes or more" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, error",
    [
        ('submit: {partitions: {"a]=1": {min_gpus: 1}}}', "not a Slurm partition name"),
        ("submit: {min_gpus: x}", "submit.min_gpus: expected int"),
    ],
)
def test_cli_refuses_bad_config_without_traceback(tmp_path: Path, capsys, text, error) -> None:
    assert cli(["submit-policy", "--config", str(site(tmp_path, text)), "--lua"]) == 2
    assert error in capsys.readouterr().err


def test_cli_names_an_unwritable_output(tmp_path: Path, capsys) -> None:
    conf = site(tmp_path, "{}")
    assert cli(["submit-policy", "--config", str(conf), "--lua", "-o", "/nonexistent/x.lua"]) == 2
    assert "cannot write /nonexistent/x.lua" in capsys.readouterr().err


# ------------------------------------------------------------------ the Lua itself

STUB = "slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, ESLURM_ACCESS_DENIED = 2002}\nslurm.log_user = function() end\nslurm.log_info = slurm.log_user\n"


def run_lua(tmp_path: Path, conf: str, body: str, stdin: bytes = b"") -> str:
    """Run `body` after the rendered job_submit.lua (with a stub `slurm` table); its stdout."""
    plugin, script = tmp_path / "job_submit.lua", tmp_path / "t.lua"
    plugin.write_text(render_lua(submit(tmp_path, conf)))
    script.write_text(f"{STUB}dofile({lua_string(str(plugin))})\n{body}")
    proc = subprocess.run([LUA, str(script)], input=stdin, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode("utf-8", "surrogateescape")


PIECES = ["gpugate:", "ckpt", "=", "/d/x", "no-ckpt", "skip", "_", "A", "a", " ", ",", ";",
          "\t", "\n", "\x1c", "\xa0", "\u2003", "\u3000", "\u200b", "é", "-", ":", "gpugate:ckpt="]  # fmt: skip
CASES = [
    "gpugate:ckpt=/data/run1 gpugate:skip",
    "x gpugate:ckpt=/a,gpugate:restarts=2;gpugate:no-ckpt",
    "gpugate:_ gpugate:__ gpugate:b",
    "xgpugate:ckpt=/a gpugate:ckpt=/b",
    "gpugate:ckpt=/a\u00a0gpugate:skip\u3000gpugate:z=1",
    "",
]


@needs_lua
def test_lua_reads_comments_exactly_like_comment_tokens(tmp_path: Path) -> None:
    rng = random.Random(19)
    cases = CASES + ["".join(rng.choice(PIECES) for _ in range(12)) for _ in range(400)]
    body = """
local data = io.read("*a")
for comment in string.gmatch(data, "([^%z]*)%z") do
  local t, keys = gpugate_comment_tokens(comment), {}
  for k in pairs(t) do table.insert(keys, k) end
  table.sort(keys)
  for _, k in ipairs(keys) do io.write(k, "\\1", t[k], "\\2") end
  io.write(gpugate_opted_out(comment) and "Y" or "N", "\\0")
end
"""
    stdin = b"".join(c.encode() + b"\0" for c in cases)
    got = run_lua(tmp_path, "{}", body, stdin).split("\0")[:-1]
    for comment, line in zip(cases, got):
        tokens = comment_tokens(comment)
        want = "".join(f"{k}\1{tokens[k]}\2" for k in sorted(tokens))
        # The opt-out flag: comment_tokens reads `gpugate:no-ckpt` as the key "no".
        flag = any(t == "no-ckpt" for t in _bare_tokens(comment))
        assert line == want + ("Y" if flag else "N"), repr(comment)
    assert len(got) == len(cases)


def _bare_tokens(comment: str) -> list[str]:
    import re

    return re.findall(r"(?:^|[\s,;])gpugate:(no-ckpt)(?=$|[\s,;])", comment)


GPU_FORMS = [
    ("gpu:8", 8),
    ("gres:gpu:8", 8),  # 22.05
    ("gres/gpu:8", 8),  # 23.02 and later
    ("gres:gpu:h100:8", 8),
    ("gres/gpu:h100:8", 8),
    ("gres/gpu", 1),
    ("gres/gpu:h100", 1),
    ("gres/gpu=4", 4),
    ("cpu=4,gres/gpu:2", 2),  # 24.11 tres_per_task
    ("gres/gpu:a100:2,gres/gpu:h100:2", 4),
    ("gres/shard:2", 0),
    ("gres/gpumem:2", 0),
    ("", 0),
]


@needs_lua
def test_lua_counts_gpus_in_every_form(tmp_path: Path) -> None:
    body = "".join(f"print(gpugate_gpus_in({lua_string(t)}))\n" for t, _ in GPU_FORMS)
    got = run_lua(tmp_path, "{}", body).split()
    assert [int(float(g)) for g in got] == [n for _, n in GPU_FORMS]


PER_UNIT = [
    "ntasks_per_socket = 1",
    "ntasks_per_core = 1",
    "ntasks_per_board = 1",
    "ntasks_per_tres = 1",  # --ntasks-per-gpu
    "sockets_per_node = 1",
    "cores_per_socket = 1",
    "threads_per_core = 1",
    "boards_per_node = 1",
    "sockets_per_board = 1",
    "core_spec = 1",  # 26.05's job_desc and job_rec
    "min_mem_per_cpu = 600",  # pn_min_memory with MEM_PER_CPU
    'cpus_per_tres = "gres/gpu:4"',
    'mem_per_tres = "gres/gpu:40960"',
    'tres_per_task = "gres/gpu:1"',
]
TWO_CPUS = "{d = {name = 'd', flag_default = 1, total_cpus = 6, total_nodes = 3, max_cpus_per_node = 4294967295}}"
EIGHT_CPUS = (
    "{d = {name = 'd', flag_default = 1, total_cpus = 6, total_nodes = 3, max_cpus_per_node = 8}}"
)
JOBS = [
    # (job_desc as Lua, part_list as Lua, refused?)
    ('{tres_per_node = "gres:gpu:8", min_nodes = 2}', "{}", True),
    ('{tres_per_node = "gres:gpu:8", min_nodes = 4294967294}', "{}", False),
    ('{tres_per_job = "gres/gpu:16"}', "{}", True),
    ('{tres_per_task = "gres/gpu:1", num_tasks = 16}', "{}", True),
    ('{min_nodes = 2, comment = "gpugate:ckpt=/ckpt/run"}', "{}", False),
    ('{min_nodes = 2, comment = "gpugate:ckpt=relative"}', "{}", True),
    ('{min_nodes = 2, comment = "gpugate:ckpt="}', "{}", True),
    ('{min_nodes = 2, comment = "gpugate:no-ckpt"}', "{}", False),
    ('{min_nodes = 2, comment = "gpugate:no-ckptx"}', "{}", True),
    ('{tres_per_node = "gres/gpu:8", partition = "big"}', "{}", True),
    ('{tres_per_node = "gres/gpu:8", partition = "small,big"}', "{}", True),
    ('{min_nodes = 3, partition = "tiny"}', "{}", False),
    ('{tres_per_node = "gres/gpu:8"}', '{big = {name = "big", flag_default = 1}}', True),
    ('{tres_per_node = "gres/gpu:8"}', '{x = {name = "x", flag_default = 0}}', False),
    # A node range counts at its top (attack 6: `sbatch -N 1-3`); unset tops are no range.
    ("{min_nodes = 1, max_nodes = 3}", "{}", True),
    ("{min_nodes = 1, max_nodes = 1}", "{}", False),
    ("{min_nodes = 1, max_nodes = 4294967294}", "{}", False),
    ("{min_nodes = 1, max_nodes = 4294967295}", "{}", False),
    ("{min_nodes = 1, max_nodes = 0}", "{}", False),
    ('{min_nodes = 1, max_nodes = 2, tres_per_node = "gres:gpu:4", partition = "big"}', "{}", True),
    # The nodes tasks imply (attack 6: `--ntasks=2 --ntasks-per-node=1`); NO_VAL16 is unset.
    ("{num_tasks = 2, ntasks_per_node = 1}", "{}", True),
    ("{num_tasks = 3, ntasks_per_node = 2, min_nodes = 4294967294}", "{}", True),
    ("{num_tasks = 2, ntasks_per_node = 2}", "{}", False),
    ("{num_tasks = 2, ntasks_per_node = 65534, cpus_per_task = 65534}", "{}", False),
    (
        '{ntasks_per_node = 4, min_nodes = 1, tres_per_task = "gres/gpu:4", partition = "big"}',
        "{}",
        True,
    ),
    # ... and the partition's CPUs per node: MaxCPUsPerNode, else its CPUs over its nodes.
    ("{num_tasks = 3}", TWO_CPUS, True),
    ("{num_tasks = 2}", TWO_CPUS, False),
    ("{num_tasks = 2, cpus_per_task = 2}", TWO_CPUS, True),
    ("{num_tasks = 1, min_cpus = 4}", TWO_CPUS, True),
    ("{num_tasks = 4}", EIGHT_CPUS, False),
    ("{num_tasks = 3}", "{}", False),
    # The nodes a job names (slurmctld gave a job without -N both of `ReqNodeList=n[1-2]`).
    ('{req_nodes = "n[1-2]"}', "{}", True),
    ('{req_nodes = "n1"}', "{}", False),
    ('{req_nodes = ""}', "{}", False),
    # --spread-job (bit 8 of bitflags): a node per task.
    ("{num_tasks = 2, bitflags = 16384 + 256}", "{}", True),
    ("{num_tasks = 2, bitflags = 16384}", "{}", False),
    ("{num_tasks = 2, max_nodes = 1, min_nodes = 1, bitflags = 256}", "{}", False),
    # A het job's components come one at a time: every het job counts as large.
    ("{het_job_offset = 0, min_nodes = 1, max_nodes = 1}", "{}", True),
    ("{het_job_offset = 1, min_nodes = 1}", "{}", True),
    ('{het_job_offset = 1, min_nodes = 1, comment = "gpugate:ckpt=/c"}', "{}", False),
    ('{het_job_offset = 0, partition = "tiny"}', "{}", False),
    ("{het_job_offset = 4294967294, min_nodes = 1}", "{}", False),
    # Issue 41 R1: a per-unit task limit caps tasks per node by sockets, cores, threads, boards,
    # memory or GPUs the Lua cannot see; without -N the job counts a node per task.
    *[(f"{{num_tasks = 2, {limit}}}", "{}", True) for limit in PER_UNIT],
    *[
        (f"{{num_tasks = 2, min_nodes = 1, max_nodes = 1, {limit}}}", "{}", False)
        for limit in PER_UNIT
    ],
    *[(f"{{num_tasks = 1, {limit}}}", "{}", False) for limit in PER_UNIT],
    (
        "{num_tasks = 2, ntasks_per_socket = 65534, threads_per_core = 0, sockets_per_node = 65535}",
        "{}",
        False,
    ),
    ("{num_tasks = 2, min_cpus = 2, min_mem_per_cpu = 0, cpus_per_tres = ''}", "{}", False),
    ("{min_cpus = 4, cpus_per_task = 2, threads_per_core = 1}", "{}", True),  # no num_tasks: 2
    ("{min_cpus = 4, cpus_per_task = 4, threads_per_core = 1}", "{}", False),  # one task
    ("{num_tasks = 3, ntasks_per_socket = 1, min_nodes = 1, max_nodes = 2}", "{}", True),
    ("{num_tasks = 2, ntasks_per_socket = 1, partition = 'tiny'}", "{}", False),
    # GPUs per socket count on each socket of a node (--sockets-per-node, required with them).
    (
        '{tres_per_socket = "gres/gpu:4", sockets_per_node = 2, min_nodes = 1, max_nodes = 1, partition = "big"}',
        "{}",
        True,
    ),
    (
        '{tres_per_socket = "gres/gpu:2", sockets_per_node = 2, min_nodes = 1, max_nodes = 1, partition = "big"}',
        "{}",
        False,
    ),
]
POLICY = "submit: {partitions: {big: {min_gpus: 8}, tiny: {min_gpus: 0, min_nodes: 0}}}"


@needs_lua
def test_lua_decides_by_size_partition_and_comment(tmp_path: Path) -> None:
    body = "".join(
        f"print(slurm_job_submit({job}, {parts}, 1000) == slurm.ERROR)\n" for job, parts, _ in JOBS
    )
    got = run_lua(tmp_path, POLICY, body).split()
    assert got == [str(refused).lower() for _, _, refused in JOBS]


@needs_lua
def test_lua_opt_out_and_message_follow_the_site(tmp_path: Path) -> None:
    conf = 'submit: {allow_opt_out: false, message: "See the \\"wiki\\"."}'
    body = 'print(gpugate_check({min_nodes = 2, comment = "gpugate:no-ckpt"}, {}))\n'
    out = run_lua(tmp_path, conf, body)
    assert "opting out (gpugate:no-ckpt) is not allowed" in out
    assert out.strip().endswith('See the "wiki".')
    assert "to opt out" not in out


# scontrol update: job_desc holds only what the update sets (the rest NO_VAL / nil), job_rec the
# job as it is (Slurm 22.05's record has no num_tasks; max_nodes 0 when unset, 26.05's num_tasks).
UNSET = ("min_nodes = 4294967294, max_nodes = 4294967294, num_tasks = 4294967294, "
         "min_cpus = 4294967294, ntasks_per_node = 65534, cpus_per_task = 65534, het_job_offset = 0")  # fmt: skip
LARGE = '{comment = "gpugate:ckpt=/x", min_nodes = 2, max_nodes = 2, min_cpus = 2, total_nodes = 0, het_job_id = 0}'
SMALL = "{min_nodes = 1, max_nodes = 1, min_cpus = 1, total_nodes = 0, het_job_id = 0}"
FREE = SMALL.replace("max_nodes = 1", "max_nodes = 0")  # no -N: nothing bounds its nodes
MODIFY = [
    # (the update's fields, job_rec, refused?)
    ('comment = "nothing"', LARGE, True),  # attack 6: drop the checkpoint of a large job
    ('comment = ""', LARGE, True),
    ('comment = "gpugate:ckpt=/y"', LARGE, False),  # another checkpoint directory is fine
    ('comment = "gpugate:ckpt=y"', LARGE, True),
    ("min_nodes = 2, max_nodes = 3", SMALL, True),  # attack 6: NumNodes=2-3
    ("min_nodes = 1, max_nodes = 3", SMALL, True),
    ("num_tasks = 2, ntasks_per_node = 1", SMALL, True),
    ('tres_per_node = "gres:gpu:16"', SMALL, True),
    ('partition = "big", tres_per_node = "gres:gpu:8"', SMALL, True),
    ('comment = "nothing"', SMALL, False),
    ('req_nodes = "gpu-node-0[1-2]"', SMALL, True),
    ('req_nodes = "gpu-node-01"', SMALL, False),
    ("min_nodes = 1, max_nodes = 1", LARGE.replace("gpugate:ckpt=/x", "old"), False),  # shrink
    ("", LARGE.replace("gpugate:ckpt=/x", "old"), False),  # AdminComment, ExcNodeList, ...
    ('comment = "gpugate:ckpt=/x"', SMALL.replace("min_nodes = 1", "min_nodes = 3"), False),
    ('comment = "x"', SMALL.replace("het_job_id = 0", "het_job_id = 7"), True),
    ('comment = "x"', SMALL.replace("total_nodes = 0", "total_nodes = 2"), True),  # running
    # Issue 41 R2: the record hides its task limits (`-n1 --ntasks-per-node=1`), so more tasks
    # without -N count a node each; so do per-unit limits an update sets, and a dropped
    # checkpoint of a job whose size the record cannot show.
    ("num_tasks = 2", FREE, True),
    ("num_tasks = 2, min_nodes = 1, max_nodes = 1", FREE, False),
    # 26.05's record of `-n1` without -N has max_nodes 1 (JOB_IMPLICIT_MAX_NODES), which grows
    # with NumTasks=; job_rec cannot tell it from -N 1's, so only NumNodes= in the update bounds.
    ("num_tasks = 2", SMALL, True),
    ("num_tasks = 2, min_nodes = 1, max_nodes = 1", SMALL, False),
    ("num_tasks = 2, max_nodes = 1", SMALL, False),
    ("num_tasks = 1", FREE, False),
    ("sockets_per_node = 1", FREE.replace("min_cpus = 1", "min_cpus = 2"), True),
    ("threads_per_core = 1", FREE, False),  # one CPU: one task
    ("min_mem_per_cpu = 600", FREE.replace("min_cpus = 1", "min_cpus = 2"), True),
    ('cpus_per_tres = "gres/gpu:2"', FREE.replace("min_cpus = 1", "min_cpus = 2"), True),
    ('tres_per_node = "gres:gpu:4"', FREE, False),
    (
        'partition = "big"',
        FREE.replace("min_cpus = 1", 'min_cpus = 2, tres_per_task = "gres/gpu:4"'),
        True,
    ),
    ('comment = "other"', FREE.replace("min_cpus = 1", "min_cpus = 4"), False),  # declared nothing
    (
        'comment = "other"',
        FREE.replace("min_cpus = 1", 'min_cpus = 2, comment = "gpugate:ckpt=/c"'),
        True,
    ),
    (
        'comment = "other"',
        SMALL.replace("min_cpus = 1", 'min_cpus = 2, comment = "gpugate:ckpt=/c"'),
        False,
    ),
    (
        'comment = "gpugate:ckpt=/d"',
        FREE.replace("min_cpus = 1", 'min_cpus = 8, comment = "gpugate:ckpt=/c"'),
        False,
    ),
]


@needs_lua
def test_lua_checks_updates_against_the_job_as_it_would_be(tmp_path: Path) -> None:
    body = "".join(
        f"print(slurm_job_modify({{{UNSET}, {change}}}, {rec}, {{}}, 1000) == slurm.ESLURM_ACCESS_DENIED)\n"
        for change, rec, _ in MODIFY
    )
    got = run_lua(tmp_path, POLICY, body).split()
    assert got == [str(refused).lower() for _, _, refused in MODIFY]


@needs_lua
def test_lua_names_an_update_refusal_and_a_het_job(tmp_path: Path) -> None:
    body = (
        f"print(gpugate_check({{het_job_offset = 0, min_nodes = 1}}, {{}}, true))\n"
        f"local rec = {LARGE}\n"
        "slurm.log_user = function(fmt, text) print(text) end\n"
        f'slurm_job_modify({{{UNSET}, comment = "gone"}}, rec, {{}}, 1000)\n'
    )
    out = run_lua(tmp_path, "{}", body).splitlines()
    assert "heterogeneous job" in out[0] and out[0].startswith("gpugate: job refused:")
    assert out[1].startswith("gpugate: update refused: it asks for 0 GPU(s) on 2 node(s)")


@needs_lua
def test_lua_says_why_tasks_counted_a_node_each(tmp_path: Path) -> None:
    body = (
        'print(gpugate_check({num_tasks = 2, ntasks_per_socket = 1, tres_per_node = "gres/gpu:8"}, {}))\n'
        "slurm.log_user = function(fmt, text) print(text) end\n"
        f"slurm_job_modify({{{UNSET}, num_tasks = 2}}, {FREE}, {{}}, 1000)\n"
    )
    out = run_lua(tmp_path, "{}", body).splitlines()
    assert out[0].startswith("gpugate: job refused: it asks for 16 GPU(s) on 2 node(s) (its tasks")
    assert "--ntasks-per-socket limits tasks per node" in out[0] and "-N/--nodes" in out[0]
    assert out[1].startswith("gpugate: update refused: it asks for 0 GPU(s) on 2 node(s)")
    assert "the job's own task limits; NumNodes= bounds its nodes" in out[1]


HOSTLISTS = [("n1", 1), ("n[1-2]", 2), ("n[1-3,5],gpu-7", 5), ("r[1-2]n[1-4]", 8), ("", 0)]


@needs_lua
def test_lua_counts_the_nodes_of_a_hostlist(tmp_path: Path) -> None:
    body = "".join(f"print(gpugate_hosts_in({lua_string(h)}))\n" for h, _ in HOSTLISTS)
    got = run_lua(tmp_path, "{}", body).split()
    assert [int(float(n)) for n in got] == [n for _, n in HOSTLISTS]
