"""The installed .deb on a real Slurm, shared by the install and upgrade tests."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from e2e import Site
    from localslurm import LocalSlurm


def ecc_node_refuses_the_job(cluster: LocalSlurm, site: Site) -> None:
    """n2 (uncorrectable ECC) refuses a job: held, drained by gpugate, the job never ran."""
    marker = site.base / "ran-n2"
    job = cluster.submit(wrap=f"touch {marker}", output=str(site.base / "n2.out"), nodelist="n2")
    state = cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=45)
    node = cluster.wait_node("n2", lambda n: "DRAIN" in n.get("State", ""), timeout=15)
    assert node["Reason"].startswith("gpugate: gpu.ecc: "), node["Reason"]
    assert state["AdminComment"].startswith("gpugate: node n2 refused: gpu.ecc"), state
    assert not marker.exists(), "the job ran on a node with an uncorrectable ECC error"
    assert not cluster.is_drained("n1")
