"""Slurm faked at the runner: recorded command output per version (tests/fixtures/slurm), served by argv."""

from __future__ import annotations

import types

import paths

from gpugate.runner import CommandResult
from gpugate.slurm.records import JobInfo, NodeInfo

FIXTURES = paths.FIXTURES / "slurm"


def fixture(rel: str) -> str:
    """The recorded output REL (below tests/fixtures/slurm/)."""
    return (FIXTURES / rel).read_text()


def result(argv, status="ok", rc=0, stdout="", stderr="") -> CommandResult:
    """A CommandResult of ARGV as the runner returns it."""
    return CommandResult(
        argv=tuple(argv),
        status=status,
        returncode=rc,
        stdout=stdout,
        stderr=stderr,
        duration_s=0.01,
    )


class FakeRunner:
    """gpugate.runner.run for tests: recorded results keyed by argv; every call is kept."""

    def __init__(self) -> None:
        self.responses: dict[tuple, CommandResult] = {}
        self.calls: list[tuple[tuple, float, dict | None]] = []

    def ok(self, argv, stdout: str = "") -> FakeRunner:
        self.responses[tuple(argv)] = result(argv, stdout=stdout)
        return self

    def fail(
        self, argv, status: str = "nonzero", rc: int | None = 1, stdout="", stderr=""
    ) -> FakeRunner:
        self.responses[tuple(argv)] = result(argv, status, rc, stdout, stderr)
        return self

    def __call__(self, argv, timeout, env=None, stdin=None) -> CommandResult:
        argv = tuple(argv)
        self.calls.append((argv, timeout, env))
        if argv not in self.responses:
            raise AssertionError(f"unexpected command: {argv}")
        return self.responses[argv]

    @property
    def argvs(self) -> list[tuple]:
        return [c[0] for c in self.calls]

    def writes(self) -> list[tuple]:
        """Every state-changing scontrol call, in a backend-neutral form."""
        return [w for w in (_normalise(a) for a in self.argvs) if w]


def _normalise(argv: tuple) -> tuple | None:
    if argv[:1] != ("scontrol",):
        return None
    verb, args = argv[1], dict(a.split("=", 1) for a in argv[2:] if "=" in a)
    if verb in ("requeue", "requeuehold"):
        return ("requeue", argv[2], verb == "requeuehold")
    if verb == "release":
        return ("release", argv[2])
    if verb != "update":
        return None
    if "NodeName" in args and "Comment" in args:
        return ("node_comment", args["NodeName"], args["Comment"])
    if "NodeName" in args:
        state = args["State"]
        return (
            ("drain", args["NodeName"], args["Reason"])
            if state == "DRAIN"
            else ("resume", args["NodeName"])
        )
    job = args["JobId"]
    if "ExcNodeList" in args:
        return ("exclude", job, tuple(n for n in args["ExcNodeList"].split(",") if n))
    if "AdminComment" in args:
        return ("comment", job, args["AdminComment"])
    return ("start_now", job) if args.get("StartTime") == "now" else ("update", job)


def fake_pyslurm(
    nodes: dict[str, NodeInfo],
    jobs: dict[int, JobInfo],
    version: str = "22.5",
    raw: dict[int, dict] | None = None,
) -> types.ModuleType:
    """A `pyslurm` module with the 22.5+ calls the backend uses, logging writes like FakeRunner.

    As the real one (docs/slurm-facts.md, measured on 22.5.3 and 24.11.0): a job without a
    reason says "None"; 22.5 prints a partly used node ALLOCATED (its CPU counts say MIXED);
    24.11 names "root" as the reason's user on a node without a reason; Job(...) and
    Job.load(...) take a plain integer id only, and every job id given is kept in `mod.ids`.
    `raw` overrides a job's attributes as pyslurm would give them (an expected end_time).
    """
    mod = types.ModuleType("pyslurm")
    log: list[tuple] = []
    ids: list[int] = []
    mod.log, mod.ids = log, ids
    raw = raw or {}

    def plain(job_id):
        # pyslurm's Job stores a uint32_t: text (or a bool) is a TypeError there.
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise TypeError(f"an integer is required, not {job_id!r}")
        ids.append(job_id)
        return job_id

    def node_state(n: NodeInfo) -> str:
        if version == "22.5" and n.state == "MIXED":
            return "+".join(("ALLOCATED", *n.flags))
        return "+".join((n.state, *n.flags))

    def cpu_counts(n: NodeInfo) -> dict:
        total = n.cpus or 0
        allocated = {"MIXED": total // 2, "ALLOCATED": total}.get(n.state, 0)
        return dict(allocated_cpus=allocated, idle_cpus=(total - allocated) if total else None)

    class RPCError(Exception):
        pass

    class Node:
        def __init__(self, name=None, **kwargs):
            self.name = name
            self.__dict__.update(kwargs)

        @staticmethod
        def load(name):
            if name not in nodes:
                raise RPCError(f"Node '{name}' does not exist")
            n = nodes[name]
            user = n.reason_user or ("root" if version == "24.11" else None)
            return Node(
                n.name,
                state=node_state(n),
                reason=n.reason or None,
                reason_user=user,
                reason_time=n.reason_time,
                partitions=list(n.partitions),
                configured_gres={"gpu": n.gres_gpus} if n.gres_gpus else {},
                total_cpus=n.cpus,
                comment=n.comment or None,  # pyslurm: None for an unset char*
                **cpu_counts(n),
            )

        def modify(self, changes):
            if self.name not in nodes:
                raise RPCError("Invalid node name specified")
            if getattr(changes, "comment", None) is not None:
                log.append(("node_comment", self.name, changes.comment))
            elif changes.state == "DRAIN":
                log.append(("drain", self.name, changes.reason))
            else:
                log.append(("resume", self.name) if changes.state == "RESUME" else ("?",))

    class Nodes:
        @staticmethod
        def load():
            return {name: Node.load(name) for name in nodes}

    class JobSubmitDescription:
        def __init__(self, **changes):
            self.changes = changes

    class Job:
        def __init__(self, job_id):
            self.id = plain(job_id)

        def _known(self):
            if self.id not in jobs:
                raise RPCError("Invalid job id specified")  # slurm_strerror(ESLURM_INVALID_JOB_ID)

        @staticmethod
        def load(job_id):
            job = Job(job_id)  # keeps the id in `ids`, once
            job._known()
            j = jobs[job_id]
            job.__dict__.update(
                user_name=j.user,
                user_id=j.uid,
                state=j.state,
                # state_desc has spaces; no reason is "None" (WAIT_NO_REASON's string)
                state_reason=j.reason.replace("_", " ") or "None",
                allocated_nodes=",".join(j.nodes) or None,
                batch_host=j.batch_host or None,
                standard_output=j.stdout,
                standard_error=j.stderr,
                working_directory=j.work_dir,
                exit_code=j.exit_code,
                exit_code_signal=j.exit_signal,
                requeue_count=j.restarts,
                comment=j.comment or None,
                admin_comment=j.admin_comment or None,
                excluded_nodes=",".join(j.excluded_nodes) or None,
                is_requeueable=j.requeue,
                partition=j.partition,
                required_nodes=",".join(j.required_nodes) or None,
                end_time=j.end_time,
                start_time=j.start_time,
            )
            job.__dict__.update(raw.get(job_id, {}))
            return job

        def requeue(self, hold=False):
            self._known()
            log.append(("requeue", str(self.id), hold))

        def release(self):
            self._known()
            log.append(("release", str(self.id)))

        def modify(self, desc):
            self._known()
            for key, value in desc.changes.items():
                if key == "excluded_nodes":
                    log.append(("exclude", str(self.id), tuple(value)))
                elif key == "admin_comment":
                    log.append(("comment", str(self.id), value))

    mod.RPCError, mod.Node, mod.Nodes = RPCError, Node, Nodes
    mod.Job, mod.JobSubmitDescription = Job, JobSubmitDescription
    return mod
