"""`rankzoo report --hf MODEL_DIR --text FILE --emit FILE`: a Hugging Face model's layer
pattern, mirrored as a zoo experiment at the sizes the user gives.

pattern.py reads the pattern from the probe (one kind per decoder layer, in layer order, and
its shortest repeating unit), refusing what has no zoo spelling; emit.py maps each kind to
the zoo block that declares the same caps and writes the experiment: the pattern beside
each of its kinds in every layer, matched in parameters.
"""
