"""Sizing: the units people type and read (units.py), the block families (families.py),
what one block setting costs (costs.py), and matching variants in parameters and cache
(match.py). Of train/ it reads only the LM's layers (train/lm/decoder.py)."""
