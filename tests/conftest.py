"""Test-wide settings. The suite runs on CPUs: Triton kernels run in its interpreter, on CPU tensors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined, so before any specops import
