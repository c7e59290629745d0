"""shellbox: a self-hosted, OpenAI-compatible hosted shell."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
