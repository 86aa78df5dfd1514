"""The Slurm hook entry points (prolog, epilog, task prolog, health) and their collection."""
