"""Between jobs: the rules by which `gpugate health` lifts the drains it set (heal.py)."""
