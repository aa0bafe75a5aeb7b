"""Running real vLLM in its own environment as the independent peer (offline, token ids in and out)."""
