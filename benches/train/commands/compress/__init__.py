"""Benchmarks of train/commands/compress/."""
