"""The report's data: the document of declared caps beside realized ranks, its schema and
reader (document.py), and the per-kind summary of layers grouped by what they are
(kinds.py)."""
