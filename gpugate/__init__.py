"""gpugate: Slurm prolog/epilog health gating for multi-GPU training nodes."""

__version__ = "0.1.0"
