"""Baseline for bench/cold_start.py: a minimal standard-library JSON-RPC worker.

The benchmark copies this file to ``<tmp>/provider/__main__.py`` beside a copy of ``shim.mjs``, so
the very same shim starts it with ``python -m provider``. It answers ``initialize`` (and echoes
anything else) and exits on ``shutdown`` or end of input.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        result: object
        if method == "initialize":
            result = {"ok": True, "supportedMethods": []}
        elif method == "health":
            result = {"status": "ok"}
        else:
            result = None if method == "shutdown" else {"echo": message.get("params")}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
        out.flush()
        if method == "shutdown":
            return


if __name__ == "__main__":
    main()
