"""The commerce task: the output contract, the prompt, synthetic data (en + zh-TW) and task metrics."""
