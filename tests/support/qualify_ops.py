"""Qualification run against fake operations: jobs, waits and results, no Slurm."""

from __future__ import annotations

import json
import os

from factories import site
from fakes import FakeSlurm

from gpugate.qualify.run import qualify_nodes

FAST, SLOW = 10.0, 2.0
NODES = ["n1", "n2", "n3"]
# The drain budget: no room for a drain, and room for every node's.
HELD_BACK = "  max_drained_share: 0.0\n  min_drains_allowed: 0\n  hardware_share: 0.0\n"
ROOM = "  max_drained_share: 1.0\n  min_drains_allowed: 5\n"


def config_with(tmp_path, budget: str = ROOM, more: str = ""):
    """A site in tmp_path with `budget:`'s lines (no settle, no jitter) and `more` lines."""
    return site(tmp_path, f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\n"
                f"budget:\n  settle_s: 0\n  jitter_s: 0\n{budget}{more}")  # fmt: skip


class FakeOps:
    """Jobs that end at once, having written their result files; reservations recorded."""

    poll_s = 0.01  # a job that never starts (`never`) is asked about this often

    def __init__(self, slurm: FakeSlurm, speed: dict[str, float], never: tuple = (),
                 error: dict[str, str] | None = None) -> None:  # fmt: skip
        self.slurm, self.speed, self.never, self.error = slurm, speed, set(never), error or {}
        self.submitted: list[list[str]] = []
        self.states: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.reservations: list[tuple[str, list[str]]] = []
        self.deleted: list[str] = []
        self.drained_at_delete: dict[str, bool] = {}
        self.fail_state: BaseException | None = None

    def submit(self, argv: list[str]) -> str:
        self.submitted.append(argv)
        job_id = str(100 + len(self.submitted))
        nodes = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        run_dir = os.path.dirname(argv[-1])
        if set(nodes) & self.never:
            self.states[job_id] = "PENDING"
            return job_id
        # The node must be in service (resumed into the reservation) to run anything.
        assert not any(self.slurm.node(n).drained for n in nodes), nodes
        if len(nodes) == 1:
            self._node_results(run_dir, nodes[0], job_id)
        else:
            bw = min(self.speed[n] for n in nodes)
            self._write(run_dir, f"pair-{nodes[0]}-{nodes[1]}", "allreduce",
                        {"test": "allreduce", "backend": "gloo", "busbw_gbps": bw})  # fmt: skip
        self.states[job_id] = "COMPLETED"
        return job_id

    def _node_results(self, run_dir: str, node: str, job_id: str) -> None:
        # DCGM passes here (as the dcgmi stand-in's level 1 does): the tests judge bandwidths.
        self._write(run_dir, node, "dcgm", {"test": "dcgm", "nodes": [node], "ok": True,
                    "value_gbps": None, "floor_gbps": None, "job_id": job_id,
                    "detail": "dcgm: passed (level 1)"})  # fmt: skip
        ar = {"test": "allreduce", "backend": "gloo", "busbw_gbps": self.speed[node]}
        if node in self.error:
            ar = {"test": "allreduce", "error": self.error[node]}
        self._write(run_dir, node, "allreduce", ar)
        self._write(run_dir, node, "h2d", {"test": "h2d", "node": node, "gpus": [],
                                           "skipped": "no CUDA device"})  # fmt: skip

    @staticmethod
    def _write(run_dir: str, where: str, test: str, obj: dict) -> None:
        os.makedirs(os.path.join(run_dir, where), exist_ok=True)
        with open(os.path.join(run_dir, where, f"{test}.json"), "w") as fh:
            json.dump(obj, fh)

    def state(self, job_id: str) -> tuple[str, str]:
        if self.fail_state:
            raise self.fail_state
        return self.states[job_id], "ReqNodeNotAvail" if self.states[job_id] == "PENDING" else ""

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.states[job_id] = "CANCELLED"

    def create_reservation(self, name: str, nodes: list[str], minutes: int) -> None:
        self.reservations.append((name, list(nodes)))

    def delete_reservation(self, name: str) -> None:
        self.deleted.append(name)
        self.drained_at_delete = {n: i.drained for n, i in self.slurm.infos.items()}


def go(config, slurm, ops, tests=None, **kw):
    """qualify_nodes on every node of SLURM, one at a time, through the fake OPS."""
    return qualify_nodes(config, slurm, list(slurm.infos), 1, tests, ops=ops, **kw)
