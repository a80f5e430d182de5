"""Worker tests use the shared fixtures in tests/conftest.py."""
