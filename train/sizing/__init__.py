"""Sizing: units, block families and their costs, and matched models."""
