"""Freed memory handed back to the system once a window is analysed (`latlab observe`).

A window's analysis allocates its columns and lets them go, but glibc's allocator keeps the
freed pages of its heap for later (and Arrow's pool its blocks), so a long observe's resident
memory would stay at every window's high-water mark and the intake's own churn would land on
top of it. `release()` returns them: glibc's `malloc_trim` (where the C library has it) and
Arrow's `release_unused`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pyarrow as pa


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError, TypeError):  # not glibc (TypeError: no CDLL(None))
        return None


_TRIM = _malloc_trim()


def release() -> None:
    """Give the memory freed so far back to the system."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)
