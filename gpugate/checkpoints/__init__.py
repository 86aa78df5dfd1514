"""Which checkpoint is complete: each framework's layout and the torch file reader."""
