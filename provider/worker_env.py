"""Names of the worker's own environment variables, standard library only.

Read before pydantic and the driver load: by the operator commands (``python -m provider
shell``) and by the worker's start, which looks for a key of its own before it builds anything.
:mod:`provider.config` resolves the key itself (and re-exports the name).
"""

from __future__ import annotations

from typing import Final

API_KEY_ENV: Final = "CREATEOS_API_KEY"
"""The worker's own CreateOS API key, honoured for the official endpoint only."""
