"""`rankzoo compress`: shrink a model's cache to low rank and measure what that costs.

    doc = compress_run("runs/quick/mha", CompressOptions(ratios=(1.5, 2, 4)))
    doc = compress_hf("models/tiny", "calib.txt", "eval.txt", CompressOptions(), seq_len=128)

The report (budgets/advice/annotate.py) advises a low-rank KV cache from ranks it measured per
sequence. This package checks that advice with a number: it fits a basis per layer and KV
head on calibration activations (train/commands/compress/lowrank.py), evaluates the model with every
cached matrix projected onto its top r directions, exactly what a cache of r-dimensional
codes would give back, on data the bases were not fitted on, and states the loss change
at each cache size:

  zoo run        RUN_DIR/<variant>: config.yaml and checkpoints/last.ckpt; calibration on
                 the first sequences of the run's training split, evaluation on its
                 validation split (loss, accuracy), both rebuilt from config.yaml and its
                 seed as training built them (train/data/loaders.py make_splits)
  Hugging Face   --hf DIR --text CALIB --eval-text EVAL: calibration on the start of CALIB,
                 evaluation on EVAL (loss, perplexity); the same file for both is read
                 after the calibration tokens

What is projected, per family (model surgery, each undone after its evaluation; a zoo
block by the kind of cache it declares):
  softmax, sliding_window, moe, HF   keys before RoPE (W_K -> P W_K per KV head, bias too;
                 the model rotates the rebuilt keys) or, --keys post-rope, the rotated keys
                 (inside the attention), and values (W_V -> P W_V); keys of a model
                 without RoPE are projected as they are cached
  mla            the latent cache c: kv_up(c) -> kv_up(P c), i.e. W_up -> W_up P
  linear         the state S = sum phi(k) [v, 1]^T over its F feature rows: phi(k) -> P phi(k)
  ssm            the state h = sum x B^T over its N rows, per B/C group: B -> P B (the conv
                 state is kept in full)
  a window head  (mixed, softmax family and HF layers without a window of their own) its
                 KV head's query heads attend under a mask: the W recent keys and s sinks

Bases: output-aware by default (each slot's error weighed as its reader sees it: keys
through the queries and the attention, values through W_O and the attention, MLA's latent
through both, on one scale of squared output error per token;
train/commands/compress/readout.py), or by energy (--bases energy). Cost model: the bases
are fitted once and shared, so they are weights: a row's ratio counts the codes per token
alone, its basis bytes once per model.

Settings evaluated: the report's advised ranks (per KV head, rank_eps_pooled rounded up),
per target ratio one per allocation, and per --eps the per-layer rank_eps. The default
allocations: uniform (one r), sensitivity (r per layer, head, keys and values apart, of
least loss predicted by one backward pass per label sample on the calibration tokens,
from the uniform ranks up, then kept only if no worse than uniform on the calibration
data) and mixed (per KV head full, low rank or a window of W recent keys plus s sinks,
the same way); greedy (gain per byte by each head's share) and greedy-scaled by name.
Every row carries the loss change predicted for it beside the one measured, and the
document their agreement (Spearman, predicted / measured).

The verdict: *verified* when the loss change at the advised ranks is within the
tolerance, else *refuted*, naming the largest measured ratio that is. Nothing is written
except --plot DIR and --save DIR (each new or empty) and, --record, the variant's
compress.json.

One module per job:
  train/commands/compress/options.py      CompressOptions, the keys chosen, the constants
  train/commands/compress/surgery.py      changes to a model that are undone
  train/commands/compress/zoo_surgery.py  ZooTarget: zoo blocks' caches, by cache kind
  train/commands/compress/hf_surgery.py   HFTarget: Hugging Face models' KV caches
  train/commands/compress/calibrate.py    calibration and evaluation data, the bases
  train/commands/compress/prediction.py       the report's advised ranks
  train/commands/compress/sensitivity.py  the loss each choice is predicted to cost
  train/commands/compress/windows.py      windows + sinks: masks, candidates, effects
  train/commands/compress/allocate.py     a byte budget spent by predicted loss
  train/commands/compress/choices.py      the sensitivity and mixed settings, their bytes
  train/commands/compress/settings.py     the settings per ratio, the calibration check
  train/commands/compress/agreement.py    predicted against measured
  train/commands/compress/measure.py      the rows, the verdict
  train/commands/compress/heal.py         --heal TOKENS: LoRA healing, the curve
  train/commands/compress/save.py         --save DIR
  train/commands/compress/cache.py        the low-rank cache (codes per head), zoo's
  train/commands/compress/hf_cache.py     ... as a transformers Cache
  train/commands/compress/load.py         load_compressed: a saved model and its cache
  train/commands/compress/record.py       --record: the document kept in the variant's dir
  train/commands/compress/run.py          compress_run, compress_hf: the document
  train/render/compress.py                the table (rich, Markdown) and the figure
  train/render/heal.py                    the healing curve's table and figure
"""

from .load import Saved, load_compressed
from .options import CompressOptions, cache_dtype
from .run import compress_hf, compress_run

__all__ = ["CompressOptions", "Saved", "cache_dtype", "compress_hf", "compress_run",
           "load_compressed"]
