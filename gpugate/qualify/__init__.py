"""Active qualification of nodes (issue 17): DCGM diagnostics and fabric bandwidth as Slurm jobs.

`gpugate qualify NODE...` (gpugate/commands/qualify.py) runs, through `run.qualify_nodes`, one
exclusive job per node (the DCGM step, `dcgm.py`; the all-reduce and host-to-device payload,
`payload.py`, a standalone script the site's torch interpreter runs) and pairwise jobs
(`pairs.py`), judges the results against the board's floors (`floors.py`) and records each
node's outcome (gpugate/store/qualify.py), its drain and its evidence bundle. Every result is
one TEST RESULT dict: test, nodes, ok (None: not judged), value_gbps, floor_gbps, detail, job_id.
"""
