"""``python3 -m provider shell [--api-url ORIGIN] SANDBOX_ID``: checks, then the relay.

Every refusal comes before any HTTP request and exits with :data:`EXIT_USAGE`: a bad argument, a
missing or malformed ``CREATEOS_API_KEY`` (the key is read from the environment only, never
from the command line or the connection payload, and never printed), an API URL that
:func:`provider.config.normalize_api_url` refuses (``https``, or ``http`` for loopback), an
invalid sandbox id. The relay (:mod:`provider.shell.session`, anyio and httpx) is imported only
once they pass.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Final

from provider.cli_args import Refused as _Refused
from provider.cli_args import RefusingParser as _Parser
from provider.worker_env import API_KEY_ENV

EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
PROG: Final = "python3 -m provider shell"


def _parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Open an interactive shell (/bin/bash -l in /paperclip-workspace) in a CreateOS "
            "sandbox, on this terminal. The API key is read from the CREATEOS_API_KEY "
            "environment variable only. Exit the shell (or close the terminal) to disconnect; "
            "the remote shell is then deleted."
        ),
    )
    parser.add_argument(
        "--api-url",
        default=None,
        metavar="URL",
        help="the CreateOS API URL: an origin, optionally with a gateway's path prefix "
        "(default https://api.sb.createos.sh; http only for localhost, 127.0.0.1 or [::1])",
    )
    parser.add_argument("sandbox_id", metavar="SANDBOX_ID", help="the sandbox to open a shell in")
    return parser


def api_key_from_env(environ: Mapping[str, str]) -> str:
    """The trimmed ``CREATEOS_API_KEY``, or :class:`_Refused` naming the fix (never the key)."""
    key = environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise _Refused(
            f"{API_KEY_ENV} is not set. Export the CreateOS API key that owns the sandbox in this "
            f"terminal first (export {API_KEY_ENV}=...); it is never taken from the command line."
        )
    if not all(0x21 <= ord(ch) <= 0x7E for ch in key):
        raise _Refused(
            f"{API_KEY_ENV} holds spaces, control or non-ASCII characters; set it to the API key "
            "alone."
        )
    return key


def _checked(argv: Sequence[str]) -> tuple[str, str, str]:
    """(origin, key, sandbox id) or :class:`_Refused` with every problem found."""
    args = _parser().parse_args(list(argv))
    from provider.config import DEFAULT_API_URL, normalize_api_url
    from provider.createos.models import is_valid_id
    from provider.errors import ConfigError

    problems: list[str] = []
    key = ""
    try:
        key = api_key_from_env(os.environ)
    except _Refused as exc:
        problems.append(str(exc))
    origin = ""
    try:
        origin = normalize_api_url(args.api_url if args.api_url is not None else DEFAULT_API_URL)
    except ConfigError as exc:
        problems.append("--api-url: " + str(exc).replace("apiUrl is", "the URL is", 1))
    if not is_valid_id(args.sandbox_id):
        problems.append("SANDBOX_ID must be 1 to 200 letters, digits, '-' or '_'.")
    if problems:
        raise _Refused("\n".join(problems))
    return origin, key, args.sandbox_id


def main(argv: Sequence[str]) -> int:
    """Run the helper; answers the exit code (the remote shell's, 1 for a signal or a failure,
    2 for a refusal, 128 + n after local signal n)."""
    try:
        origin, key, sandbox_id = _checked(argv)
    except SystemExit as exc:  # --help
        sys.stdout.flush()
        return exc.code if isinstance(exc.code, int) else 0
    except _Refused as exc:
        sys.stderr.write(f"{PROG}: refused: " + str(exc).replace("\n", f"\n{PROG}: refused: "))
        sys.stderr.write(f"\nusage: {PROG} [--api-url ORIGIN] SANDBOX_ID\n")
        return EXIT_USAGE
    try:
        import anyio

        from provider.shell.session import run_shell

        return anyio.run(run_shell, origin, key, sandbox_id)
    except KeyboardInterrupt:  # before the relay took over SIGINT: nothing was started
        return EXIT_INTERRUPTED
