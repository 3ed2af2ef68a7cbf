"""How much rank a matrix uses: the exact spectra (spectra.py), the effective-rank metrics
read from them (metrics.py), ranks of mixing matrices known only through products at long
lengths (matfree.py), and the exact singular values of LoRA updates (adapters.py)."""
