"""The model compress works on, behind one protocol (protocol.py Target): ZooTarget
(zoo_surgery.py, with one projection per zoo cache kind in zoo_projections.py) and HFTarget
(hf_surgery.py) each say what their cache holds, fit its activations and weights, project
it by surgery that is undone (surgery.py), evaluate, heal and save, and how a saved model of
their kind is loaded and decodes through a cache of codes (cache.py, hf_cache.py); every
difference between models, zoo or Hugging Face, KV cache, latent or state, is answered
here rather than branched on by the rooms that use a target.
"""
