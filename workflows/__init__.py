"""Deterministic orchestration only: the session drain and the recovery sweep."""
