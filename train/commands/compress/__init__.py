"""`rankzoo compress`: shrink a model's cache to low rank and measure what that costs.

    doc = compress_run("runs/quick/mha", CompressOptions(ratios=(1.5, 2, 4)))
    doc = compress_hf("models/tiny", "calib.txt", "eval.txt", CompressOptions(), seq_len=128)

The report (budgets/advice/annotate.py) advises a low-rank KV cache from ranks it measured per
sequence. This package checks that advice with a number: it fits a basis per layer and KV
head on calibration activations (train/commands/compress/bases/lowrank.py), evaluates the
model with every cached matrix projected onto its top r directions, exactly what a cache
of r-dimensional codes would give back, on data the bases were not fitted on, and states
the loss change at each cache size:

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
train/commands/compress/bases/readout.py), or by energy (--bases energy). Cost model: the
bases are fitted once and shared, so they are weights: a row's ratio counts the codes per
token alone, its basis bytes once per model.

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

Rooms by job (paths relative to train/commands/compress/). options.py is read by every
room; bases/ reads nothing else of the package, target/ reads bases/, allocation/ reads
both, heal.py reads bases/ and target/, saved/ reads those three (a healed setting is what
it saves), and measure.py, prediction.py and run.py read the rooms. What differs between
models (zoo or Hugging Face, a KV cache or a latent or a state) is an attribute or a method
of the target (target/protocol.py), not a branch in the rooms that use it:

  the command    __init__.py: this map and the public names (CompressOptions, cache_dtype,
                 compress_run, compress_hf, load_compressed, Saved)
    options.py           CompressOptions, the keys chosen, the constants
    run.py               compress_run, compress_hf: load, calibrate, measure, heal, save
    prediction.py        the report's advised ranks: the claim the verdict checks
    measure.py           the rows, the verdict
    heal.py              --heal TOKENS: LoRA healing, the curve
  bases/         what each cache slot keeps, fitted on calibration activations
    calibrate.py         calibration and evaluation data, the bases fitted on them
    lowrank.py           slots and their statistics: bases, projections, bytes, plain ranks
    readout.py           the weights of output-aware bases, on one scale
    windows.py           windows + sinks: masks, candidates, effects
  target/        a model as compress drives it: one protocol, a zoo and a Hugging Face side
    protocol.py          Target: every question compress asks a model; PerSequence
    surgery.py           changes to a model that are undone
    zoo_projections.py   per zoo cache kind (kv, latent, state): how it is read and projected
    zoo_surgery.py       ZooTarget: a DecoderLM of one block family
    hf_surgery.py        HFTarget: a Hugging Face model's KV caches
    cache.py             a saved slot's codec, zoo's low-rank KV cache of codes
    hf_cache.py          ... as a transformers Cache
  allocation/    where the bytes go: the settings measured and the loss predicted for each
    sensitivity.py       the loss each choice is predicted to cost
    allocate.py          a byte budget spent by predicted loss
    choices.py           the sensitivity and mixed settings, their bytes
    settings.py          the settings per ratio, the calibration check
    agreement.py         predicted against measured
  saved/         what compress writes and reads back
    save.py              --save DIR: the compressed model and its bases
    load.py              load_compressed: a saved model and its cache of codes
    record.py            --record: the document kept in the variant's dir
  elsewhere
    train/render/compress.py   the table (rich, Markdown) and the figure
    train/render/heal.py       the healing curve's table and figure
"""

from .options import CompressOptions, cache_dtype
from .run import compress_hf, compress_run
from .saved.load import Saved, load_compressed

__all__ = ["CompressOptions", "Saved", "cache_dtype", "compress_hf", "compress_run",
           "load_compressed"]
