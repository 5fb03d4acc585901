"""Makes notebooks/conftest.py import as ``notebooks.conftest``, so it does not shadow
tests/conftest.py (both would otherwise be the top-level module ``conftest``)."""
