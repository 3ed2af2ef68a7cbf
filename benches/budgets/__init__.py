"""Benchmarks of budgets/."""
