"""The docs a newcomer needs are in the repo: nothing cites the specs outside it, and every
``docs/protocol.md <number>`` a file cites is a numbered entry of that page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = REPO_ROOT / "docs" / "protocol.md"
THIS_FILE = "tests/test_docs.py"


# The specs' file names anywhere, and the two generic names (packaging.md, design.md) when they
# stand alone rather than as a path inside the repo (docs/design.md would be fine).
OUTSIDE_THE_REPO = re.compile(
    r"\.\./shared|shared/spec|shared/notes|provider-behavior\.md|host-protocol\.md"
    r"|createos-api\.md|agent-run\.md|sdk-agreement\.md|(?<![\w/.-])(?:packaging|design)\.md"
)

NUMBER = r"[HCA]?\d+(?:\.\d+)*"
CITATION = re.compile(
    rf"docs/protocol\.md (?P<first>{NUMBER})(?P<rest>(?:(?:,\s+|-|/| and ){NUMBER})*)"
)
# A numbered entry: a heading that starts with its number, or a list item that starts with it
# in bold (``- **2.10.6** Keepalive``, ``- **C1.8 Retries**``).
ENTRY = re.compile(rf"^(?:#{{2,6}} |\s*- \*\*)(?P<number>{NUMBER})[\s*:]", re.MULTILINE)


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name]


def tracked_texts() -> dict[str, str]:
    texts = {}
    for name in tracked_files():
        path = REPO_ROOT / name
        if path.is_file():
            texts[name] = path.read_bytes().decode("utf-8", "replace")
    return texts


def protocol_entries() -> list[str]:
    return [m.group("number") for m in ENTRY.finditer(PROTOCOL.read_text())]


def cited_numbers(text: str) -> list[str]:
    found = []
    for m in CITATION.finditer(text):
        found.append(m.group("first"))
        found += re.findall(NUMBER, m.group("rest"))
    return found


def test_no_file_outside_docs_cites_the_specs_outside_the_repo() -> None:
    offenders = [
        f"{name}:{line_no}: {line.strip()}"
        for name, text in tracked_texts().items()
        if not name.startswith("docs/") and name != THIS_FILE
        for line_no, line in enumerate(text.splitlines(), 1)
        if OUTSIDE_THE_REPO.search(line)
    ]
    assert offenders == [], "cite docs/protocol.md (or README.md, RELIABILITY.md) instead:\n" + (
        "\n".join(offenders)
    )


def test_every_cited_protocol_number_is_an_entry_there() -> None:
    entries = set(protocol_entries())
    missing = sorted(
        {
            f"{name}: docs/protocol.md {number}"
            for name, text in tracked_texts().items()
            for number in cited_numbers(text)
            if number not in entries
        }
    )
    assert missing == [], "no such numbered entry in docs/protocol.md:\n" + "\n".join(missing)


def test_protocol_numbers_are_unique_and_readme_links_the_page() -> None:
    entries = protocol_entries()
    assert len(entries) > 100
    assert sorted({n for n in entries if entries.count(n) > 1}) == []
    assert "docs/protocol.md" in (REPO_ROOT / "README.md").read_text()


def test_the_rules_catch_what_they_are_for() -> None:
    # The patterns themselves, on sample text, so a typo cannot make the two tests above vacuous.
    assert OUTSIDE_THE_REPO.search("see ../shared/spec/provider-behavior.md 2.12")
    assert OUTSIDE_THE_REPO.search("(host-protocol.md 10.4)")
    assert OUTSIDE_THE_REPO.search("the rules of packaging.md")
    assert not OUTSIDE_THE_REPO.search("see docs/design.md and packaging/README.md")
    assert cited_numbers("(docs/protocol.md H10.2-H10.3, docs/protocol.md 5.2/5.6 and 2.10.6)") == [
        "H10.2",
        "H10.3",
        "5.2",
        "5.6",
        "2.10.6",
    ]
    assert cited_numbers(
        "docs/protocol.md C5 and C6.3: about 5 s; docs/protocol.md 4, checklist 44"
    ) == [
        "C5",
        "C6.3",
        "4",
    ]
