"""Facts, sources, checks, the Xid catalog and the job-failure diagnosis (`gpugate.checks`)."""
