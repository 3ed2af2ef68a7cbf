"""Benchmarks of train/commands/."""
