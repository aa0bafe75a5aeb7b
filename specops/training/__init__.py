"""Domain fine-tuning of EAGLE-3 drafts: self-distilled data, training-time test, vLLM-loadable output."""
