"""Suite-wide settings.

The tests use tiny tensors, where OpenMP's fan-out over threads costs more than it saves
(and on a shared 2-core machine it made the suite several times slower): one thread.
"""

import torch

torch.set_num_threads(1)
