"""The Slurm adapter: the only code that talks to Slurm (scontrol/sinfo, pyslurm, parsers)."""
