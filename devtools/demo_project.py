"""The small project the demo syncs into the sandbox, and the commands it runs there.

``write_project(root)`` lays out a few files and directories, including a ``node_modules`` folder
the sync excludes. ``build.sh`` is a build-like script that prints progress on stdout and
warnings on stderr with short pauses (so live output is visible as it streams), reads release
notes from stdin, sees ``BUILD_MODE`` from the environment and writes ``dist/report.txt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

SANDBOX_PROJECT: Final = "/paperclip-workspace/project"
REPORT_RELATIVE: Final = "dist/report.txt"
REPORT_MARKER: Final = "build report: demo-project"
EXCLUDED: Final = "node_modules"

BUILD_SCRIPT: Final = """#!/usr/bin/env bash
# A build-like script: progress on stdout, warnings on stderr, small pauses between stages.
set -euo pipefail
notes="$(cat)"
echo "build: mode=${BUILD_MODE:-debug} sources=$(find src -type f | wc -l)"
for stage in lint compile test package; do
  echo "[$stage] start"
  sleep 0.4
  if [ "$stage" = test ]; then
    echo "warning: 1 test skipped (needs a GPU)" >&2
  fi
  echo "[$stage] done"
done
if [ -e node_modules ]; then echo "node_modules: present"; else echo "node_modules: excluded"; fi
mkdir -p dist
{
  echo "build report: demo-project"
  echo "mode: ${BUILD_MODE:-debug}"
  echo "notes: $notes"
  echo "files:"
  find src -type f | sort | while read -r f; do echo "  $f $(wc -c < "$f") bytes"; done
} > dist/report.txt
echo "wrote dist/report.txt ($(wc -c < dist/report.txt) bytes)" >&2
"""

FILES: Final[dict[str, str]] = {
    "README.md": "# demo-project\n\nA tiny project the CreateOS demo builds in a sandbox.\n",
    "src/main.py": "from util.text import greet\n\nprint(greet('sandbox'))\n",
    "src/util/__init__.py": "",
    "src/util/text.py": "def greet(name: str) -> str:\n    return f'hello from the {name}'\n",
    "build.sh": BUILD_SCRIPT,
    f"{EXCLUDED}/left-pad/index.js": "module.exports = (s) => s; // excluded from the sync\n",
}

RELEASE_NOTES: Final = "first build from the Paperclip demo"

# After the pause and resume: the workspace (and the report the build wrote) is still there.
CHECK_SCRIPT: Final = (
    'echo "report survived: $(head -n 1 dist/report.txt)"; '
    "echo \"workspace: $(ls -A | tr '\\n' ' ')\"; "
    "echo 'checked after resume' >&2"
)


def write_project(root: Path) -> Path:
    """Create the demo project under ``root``; returns the project folder."""
    project = root / "demo-project"
    for relative, text in FILES.items():
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (project / "build.sh").chmod(0o755)
    return project


def synced_file_count() -> int:
    """Regular files the inbound sync carries (everything but the excluded folder)."""
    return sum(1 for relative in FILES if not relative.startswith(f"{EXCLUDED}/"))
