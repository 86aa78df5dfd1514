"""`gpugate isolate apply`'s last word: the node back in service only when it is (issue 44)."""

from __future__ import annotations

from gpugate.commands.isolate import outcome
from gpugate.isolate import state
from gpugate.isolate.comment import IsolatedGpu

GPU3 = state.Isolated(gpu=IsolatedGpu(index=3, minor=3, serial="165", since=1, why="gpu.ecc"))


def _record(status: str, why: str = "") -> state.Isolation:
    return state.Isolation(node="n1", state=status, gpus=(GPU3,), updated=1.0, why=why)


def test_an_applied_isolation_puts_the_node_back() -> None:
    assert outcome("n1", _record(state.APPLIED)) == (
        True,
        "n1: GPU 3 out of Slurm's service; the node is back",
    )


def test_a_failed_one_leaves_it_drained() -> None:
    back, said = outcome("n1", _record(state.FAILED, "IsolationFailed: no count"))
    assert not back and said.endswith(
        "not isolated: IsolationFailed: no count; the node stays drained"
    )


def test_a_gpu_kept_out_by_an_undo_not_allowed_is_no_node_back() -> None:
    # apply._kept_out: the record says applied (the GPU is out) with why the node stays drained
    back, said = outcome("n1", _record(state.APPLIED, "ControllerBusy: job 14 COMPLETING"))
    assert not back
    assert said == (
        "n1: GPU 3 out of Slurm's service, but the node stays drained: "
        "ControllerBusy: job 14 COMPLETING"
    )
