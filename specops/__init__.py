"""specops: EAGLE-3 speculative decoding for LoRA-fine-tuned models, with the measurements to trust it."""

__version__ = "0.1.0"
