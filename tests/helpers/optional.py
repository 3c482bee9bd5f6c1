"""Optional modules the tests need (the oracles llama_cpp, torch and transformers; torch for the MTP trainer):
a test skips only where the module is not installed; an installed one that fails to import, load a model or run
fails the test."""

from __future__ import annotations

import importlib
import importlib.util

import pytest


def installed(name: str):
    """The module `name`; skips the test (or, at module level, the module) when it is not installed at all."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (make setup-oracle)", allow_module_level=True)
    return importlib.import_module(name)
