"""The elementwise operations between the matmuls, one definition each: torch ops (the reference, what the CPU
runs, and what training runs) or, for CUDA tensors at inference with Triton available, the fused kernels of
``models.kernels``.

Rounding follows the reference implementations: RMSNorm normalises in float32 and rounds to the model dtype before
the weight multiplies; the residual stream is kept in the model dtype.

``upload`` is how a step's host-side inputs reach the device without waiting for the work already queued there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specops.models import kernels


def _fused(x: torch.Tensor) -> bool:
    """The kernels have no backward: training (grad enabled) always takes the torch ops."""
    return kernels.enabled(x.device) and not torch.is_grad_enabled()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        return kernels.add_rms_norm(x, None, weight, eps)[0]
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x) · weight, residual + x): a sublayer's output joins the residual stream, normed."""
    if _fused(x):
        return kernels.add_rms_norm(x, residual, weight, eps)
    residual = residual + x
    return weight * F.rms_norm(residual.float(), (x.shape[-1],), eps=eps).to(x.dtype), residual


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) · up for the stacked [gate | up] projection."""
    if _fused(gate_up):
        return kernels.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``. To CUDA it goes through pinned memory, so the copy is queued behind the
    device's work instead of waiting for it (a copy from pageable memory synchronises the stream); the caching host
    allocator keeps the pinned block until the copy has run."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
