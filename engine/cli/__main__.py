"""`python -m shadowpoint.cli`."""

from __future__ import annotations

import sys

from shadowpoint.cli import main

sys.exit(main())
