"""`python -m train.cli VERB ...`: the rankzoo command without the console script."""

import sys

from . import main

sys.exit(main())
