"""What every wlb.torch module shares: the PyTorch import (optional for ``import wlb``)."""

from __future__ import annotations

try:
    import torch
except ImportError:  # wlb works without torch; only wlb.torch's classes and functions need it.
    torch = None


def require_torch() -> None:
    """Raises ImportError with the install hint when PyTorch is missing."""
    if torch is None:
        raise ImportError("wlb.torch needs PyTorch (pip install torch); wlb itself does not")
