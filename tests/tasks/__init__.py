"""Tests of pathattn.tasks: targets against independent computations, seeding, CLI."""
