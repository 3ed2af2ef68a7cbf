"""The transformers wing: probing a loaded Hugging Face causal LM.

capture.py is the one module that registers with transformers' attention and mask
interfaces; projections.py finds each layer's projections by watching a short forward;
scans.py reads Mamba-family scans; cache_rows.py what each layer caches (an MLA latent);
eager.py the models that only offer `output_attentions`; unmeasured.py names the mixers
the probe does not read; geometry.py the attention shape a config declares; probe.py runs
the probe and builds its report."""
