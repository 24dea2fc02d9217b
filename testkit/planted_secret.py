"""The secret planted in the test configs, which nothing the tests capture may ever show."""

from __future__ import annotations

__all__ = ["PLANTED_SECRET"]

# Planted in URLs, tokens and signing secrets. It must never show up in anything a test captured:
# stdout, stderr or log records, across the suite (conftest fails a test whose output holds it).
PLANTED_SECRET = "plantedSecret-7f3a9c1e5b2d"
