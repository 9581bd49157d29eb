"""`python -m ddp_preflight.hangwatch`: the `hangwatch` command."""

import sys

from ddp_preflight.cli.hangwatch import main

sys.exit(main())
