"""User-facing errors. The CLI turns these into one clear line and exit code 2, never a traceback.

They live in this import-light module so that catching them does not import torch, transformers or datasets.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A sweep spec that cannot be used; the message names the file and field path."""


class DataError(ValueError):
    """A problem with the user's data; the message is one line and names the file or source."""


class ModelError(ValueError):
    """A model that cannot be used: missing, unreadable, or incompatible with its partner."""


USER_ERRORS = (SpecError, DataError, ModelError)
