"""The explicit list of check modules. Importing one registers its checks; a missing module
fails loudly here instead of silently dropping checks from the checklist.

The order is the checklist's: the GPUs themselves, their links, the fabric and the network
between nodes, the kernel's record of what went wrong, then the host the job runs on."""

# Not alphabetical: the checklist's order (above).
# isort: off
from gpugate.checks import gpu  # noqa: F401
from gpugate.checks import links  # noqa: F401
from gpugate.checks import infiniband  # noqa: F401
from gpugate.checks import network  # noqa: F401
from gpugate.checks import kernel  # noqa: F401
from gpugate.checks import sxid  # noqa: F401
from gpugate.checks import host  # noqa: F401
# isort: on
