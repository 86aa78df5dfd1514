"""What gpugate keeps: drain history, evidence bundles, metrics, application-Xid memory."""
