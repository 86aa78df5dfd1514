"""`python -m gpugate` runs the CLI."""

import sys

from gpugate.cli import main

sys.exit(main())
