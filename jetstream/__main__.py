"""`python -m jetstream ...` runs the `jetstream` command line."""

import sys

from jetstream.cli import main

sys.exit(main())
