"""``python -m provider.devtools.demo_host``: the old name of the demo, kept for ``make demo``.

The demo lives in :mod:`provider.devtools.demo` (``python -m provider.devtools.demo --help``);
this module forwards its command line there.
"""

from __future__ import annotations

import sys

from provider.devtools.demo import main

if __name__ == "__main__":
    sys.exit(main())
