"""Slurm hooks, the Slurm adapter, policy, evidence and the CLI (`gpugate.slurm_hooks`)."""
