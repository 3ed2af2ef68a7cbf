"""Benchmarks of train/hf/."""
