"""Repo tools, not shipped: the demo, host stand-ins, the e2e server driver, call-param builders.

Tests, benches, live tests and ``make demo`` import these from the checkout (the editable install
of ``make setup`` puts the repo root on ``sys.path``, as pytest's rootdir does for tests); the npm
package carries only ``provider/``, and nothing in ``provider/`` imports from here.
"""
