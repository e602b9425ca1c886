"""Tests of memorization/data/."""
