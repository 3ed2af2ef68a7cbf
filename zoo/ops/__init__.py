"""Kernel backends, one registry per operation, each fused path beside its reference."""
