"""The explicit list of check modules. Importing one registers its checks; a missing module
fails loudly here instead of silently dropping checks from the checklist."""

from gpugate.checks import gpu  # noqa: F401
