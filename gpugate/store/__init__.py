"""What gpugate keeps: drain history, evidence bundles, metrics, application-Xid memory, the
hooks' node-local state, NCCL directories, per-run and drill records."""
