"""What a report's figures say and suggest: verdicts per row and layer (verdicts.py), the
class of each head (head_classes.py), the KV-cache advice in bytes (kv.py), and every
advice item, each advised bound checked first (annotate.py)."""
