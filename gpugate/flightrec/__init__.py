"""PyTorch flight-recorder dumps: read them safely (reader) and name the rank that stopped (culprit)."""
