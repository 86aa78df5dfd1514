"""The gate's decisions: policy, drain budget, drain, repair, suspicion, requeue."""
