"""Ray where it is installed, else None.

A rollout worker also runs outside Ray (`tlt bench worker`), and the GPU image this project is measured on has
no Ray (its wheel does not fit beside the source tree in what a device call can carry), so the modules such a
worker imports take `ray` from here and test `ray is not None` where they would ask Ray anything.
"""

from __future__ import annotations

try:
    import ray
except ImportError:
    ray = None

__all__ = ["ray"]
