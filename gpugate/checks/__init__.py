"""Facts, their sources (gather), the checks and the Xid catalog (`gpugate.checks`)."""
