"""The Slurm adapter: the only code that talks to Slurm.

`control.py` the interface the hooks call (SlurmControl, its errors), `choose.py` which
backend, `cli.py` scontrol/sinfo, `pyslurm.py` libslurm, `records.py` NodeInfo/JobInfo,
`parse_text.py` and `parse_json.py` every version's output, `hostlist.py` host names.
"""
