"""What one health run did on the repair ladder (gpugate/gate/ladder.py), apart from it: the
health run reads it at every run, and imports the ladder itself only for gpugate's own drain."""

from __future__ import annotations

from gpugate.record import Record


class Climb(Record):
    """What one health run did on the ladder: its line, whether to check again before
    deciding (a GPU reset), and whether the node is now to be replaced (RMA)."""

    said: str = ""
    rejudge: bool = False
    rma: bool = False
    rebooted: bool = False  # the node rebooted since the reboot gpugate asked for
    boot_before: str | None = None  # the boot the reboot was asked in (heal.py's evidence)
    repeats: int = 0  # drains of the same GPU or hardware check in the window (the RMA count)
