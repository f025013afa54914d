"""`python -m shadowpoint`."""

from __future__ import annotations

import sys

from shadowpoint.entry import main

sys.exit(main())
