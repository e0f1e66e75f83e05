"""Tests of pathattn.models."""
