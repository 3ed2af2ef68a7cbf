"""The capture of token-mixer calls, transformers-free: what a probe reads from any model.

    attention.py   AttentionCall (one attention call: queries, keys, values, mask, scaling,
                   window, soft-cap, sinks) and the P V engine that answers it (attend,
                   probabilities, row_blocks), a block of query rows at a time
    rope.py        keys and queries before RoPE, from the modeling module's rotary function
    masks.py       what a mask lets each query see: causal, a window of W, chunks of C
    out_proj.py    W_O: the linear whose input is the attention output (projection_weight)
    running.py     the stack of running modules (which module made a function call) and
                   the wrapper of a modeling module's own functions for the duration
    projections.py each attention layer's W_Q, W_K, W_V rows, found by watching a forward
    sdpa.py        any model's F.scaled_dot_product_attention calls, a source of its own
    scan.py        ScanCall: one Mamba-2 chunk scan or Mamba-1 selective scan
    delta.py       DeltaCall: one delta-rule chunk call (Gated DeltaNet, KDA)
    mixer.py       Mixer, the protocol every call type implements (kind, exact mixing,
                   matrix-free operator, caps, release)
    channels.py    ConvCall (a gated short convolution) and RecurrenceCall (a diagonal
                   linear recurrence): mixers whose heads are channels
    lightning.py   LightningCall: linear attention under a per-head decay
    differential.py DifferentialCall: differential attention, a softmax's heads combined
                   in pairs into signed mixing M = P1 - lambda P2

Those linear mixers' math is budgets/mixing/'s; each call also rebuilds what its module
returned from M (`readout`), so that tests check M against the module itself.

*Sources* feed calls to a probe: transformers' attention interface (budgets/hf/capture.py),
the Mamba scans of modeling modules (budgets/hf/scans.py) and the mixers read from their
modules' forwards (budgets/hf/hooked.py). Nothing in this package imports transformers or
train (tests/layering/).
"""
