"""One faulty GPU out of service instead of its whole node (issue 31, `isolate.unit: gpu`).

Slurm has no per-GPU drain, and never keeps a job off a device that gres.conf no longer names
(docs/slurm-facts.md, "One GPU out of a node"). So an isolation is Slurm's count and gres.conf
changed together, and the device denied below slurmd's cgroup: `comment.py` is how an isolated
GPU is written on the node (its Slurm Comment), which every admin view reads back.
"""
