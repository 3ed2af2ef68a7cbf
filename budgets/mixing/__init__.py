"""Each recurrent operator's math, once, torch only: its exact T x T mixing matrix, its
past->future factors (budgets/rank/factored.py's FactoredMixing) and its declared caps. The
zoo's reference kernels, its blocks and the capture of Hugging Face layers import it; none
re-derives it. One module per operator:

    ssd.py         an SSD scan (Mamba-2; Mamba-1's selective scan, one decay per state
                   entry; MiniMax's lightning attention, every step 1): N-semiseparable,
                   past->future rank <= N
    delta.py       the delta rule (DeltaNet, Gated DeltaNet, KDA): past->future rank <= K
    conv.py        a gated short convolution (lfm2): banded, past->future rank <= L - 1
    recurrence.py  a diagonal linear recurrence (RG-LRU): past->future rank <= 1 per channel
"""
