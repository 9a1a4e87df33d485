"""The error of an index that is missing, corrupt or built otherwise: one small module, so that
readers (``upr index query``) can raise it without importing the job's model."""
from __future__ import annotations

__all__ = ["IndexError_"]


class IndexError_(Exception):
    """An index directory that is missing, corrupt, or built with another function/server."""
