"""Tests of `pathattn.utils`."""
