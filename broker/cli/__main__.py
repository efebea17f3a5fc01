"""``python -m broker.cli`` is ``replaybroker``."""

import sys

from broker.cli import main

sys.exit(main())
