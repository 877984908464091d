"""`python -m spatialc` is the `spatialc` command."""

import sys

from .cli import main

sys.exit(main())
