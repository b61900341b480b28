"""``python -m provider doctor``: arguments, keys, the run, the table and the exit code.

The API key comes from ``--api-key-file`` (its first line) or ``CREATEOS_API_KEY``, the second
key only from ``--second-api-key-file``: never from the command line (other users can read it),
never printed. Progress goes to stderr, the table and the summary to stdout.

Exit codes: 0 every check ok or skipped; 1 an assumption is violated; 2 a usage error (nothing
was sent); 3 nothing or not everything could be checked (endpoint unreachable, key or create
refused, the deadline passed); 4 a sandbox the doctor created may be left behind (its delete
could not be confirmed: the summary names it); 130 interrupted (after the cleanup).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import anyio
from anyio import CancelScope

from provider.cli_args import Refused as _Refused
from provider.cli_args import RefusingParser as _Parser
from provider.config import DEFAULT_API_URL, normalize_api_url
from provider.doctor.report import render
from provider.doctor.runner import Options, RunResult, run
from provider.errors import ConfigError

EXIT_OK: Final = 0
EXIT_VIOLATED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INCOMPLETE: Final = 3
EXIT_LEFT_BEHIND: Final = 4
EXIT_INTERRUPTED: Final = 130
PROG: Final = "python -m provider doctor"
KEY_ENV: Final = "CREATEOS_API_KEY"


def _parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Check, against a live CreateOS endpoint, every API behaviour the worker relies on "
            "that its documentation leaves open. Creates one sandbox (billable on CreateOS), "
            f"deletes it at the end in every case. The key comes from --api-key-file or {KEY_ENV}."
        ),
    )
    parser.add_argument(
        "--api-url", required=True, metavar="URL", help=f"the API origin, e.g. {DEFAULT_API_URL}"
    )
    parser.add_argument(
        "--api-key-file", type=Path, metavar="FILE", help=f"a file holding the key (else {KEY_ENV})"
    )
    parser.add_argument(
        "--second-api-key-file",
        type=Path,
        metavar="FILE",
        help="another account's key: checks 404 vs 403",
    )
    parser.add_argument(
        "--shape", default="s-1vcpu-1gb", metavar="SHAPE", help="sandbox shape (s-1vcpu-1gb)"
    )
    parser.add_argument("--rootfs", default=None, help="sandbox image (the provider's default)")
    parser.add_argument(
        "--auto-pause-seconds",
        type=int,
        default=60,
        metavar="N",
        help="idle window checked (60, CreateOS's minimum; an emulator may allow less)",
    )
    parser.add_argument(
        "--stream-seconds",
        type=float,
        default=35.0,
        metavar="S",
        help="how long each silent command runs for the heartbeat checks (35)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=900.0,
        metavar="S",
        help="overall seconds before cleanup (900)",
    )
    return parser


def _key(text: str, where: str) -> str:
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise _Refused(f"{where} holds no API key")
    if not all(0x21 <= ord(ch) <= 0x7E for ch in key):
        raise _Refused(f"{where} holds spaces, control or non-ASCII characters in the key")
    return key


def _key_file(path: Path, flag: str) -> str:
    try:
        return _key(path.read_text(encoding="utf-8", errors="replace"), f"{flag} {path}")
    except OSError as exc:
        raise _Refused(f"{flag} {path} cannot be read ({exc.strerror})") from None


def options_from(argv: Sequence[str]) -> Options:
    """Parsed and checked options, or :class:`_Refused` naming every problem (nothing sent)."""
    args = _parser().parse_args(list(argv))
    problems: list[str] = []
    origin = key = ""
    second = None
    try:
        origin = normalize_api_url(args.api_url)
    except ConfigError as exc:
        problems.append("--api-url: " + str(exc).replace("apiUrl is", "the URL is", 1))
    try:
        if args.api_key_file is not None:
            key = _key_file(args.api_key_file, "--api-key-file")
        elif os.environ.get(KEY_ENV, "").strip():
            key = _key(os.environ[KEY_ENV], KEY_ENV)
        else:
            raise _Refused(f"no API key: pass --api-key-file FILE or set {KEY_ENV}")
        if args.second_api_key_file is not None:
            second = _key_file(args.second_api_key_file, "--second-api-key-file")
            if second == key:
                raise _Refused("--second-api-key-file holds the same key: give another account's")
    except _Refused as exc:
        problems.append(str(exc))
    if args.auto_pause_seconds < 1 or args.stream_seconds <= 0 or args.deadline <= 0:
        problems.append("--auto-pause-seconds, --stream-seconds and --deadline must be positive")
    if problems:
        raise _Refused("\n".join(problems))
    return Options(
        origin=origin,
        api_key=key,
        second_api_key=second,
        shape=args.shape,
        rootfs=args.rootfs,
        auto_pause_seconds=args.auto_pause_seconds,
        stream_seconds=args.stream_seconds,
        deadline_s=args.deadline,
    )


def _say(text: str) -> None:
    sys.stderr.write(f"doctor: {text}\n")
    sys.stderr.flush()


async def _watch_signals(work: CancelScope, result: RunResult) -> None:
    """The first SIGINT or SIGTERM stops the checks; later ones are refused until the cleanup
    (bounded) is done, so a second Ctrl-C cannot abandon a sandbox."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if result.stopped is None or not result.stopped.startswith("interrupted"):
                result.stopped = f"interrupted ({signal.Signals(signum).name})"
                _say(f"{result.stopped}: deleting what was created")
                work.cancel()
            else:
                _say("still deleting what was created (bounded); please wait")


async def _run(options: Options, result: RunResult) -> None:
    async with anyio.create_task_group() as group:
        work = CancelScope()
        group.start_soon(_watch_signals, work, result)
        with work:
            await run(options, result, say=_say)
        group.cancel_scope.cancel()


def exit_code(result: RunResult) -> int:
    findings = result.findings()
    if result.left_behind:
        return EXIT_LEFT_BEHIND
    if result.stopped is not None and result.stopped.startswith("interrupted"):
        return EXIT_INTERRUPTED
    if any(f.outcome == "violated" for f in findings):
        return EXIT_VIOLATED
    if result.setup_error is not None or result.stopped is not None:
        return EXIT_INCOMPLETE
    return EXIT_OK


def summary(options: Options, result: RunResult) -> str:
    findings = result.findings()
    counts = {o: sum(1 for f in findings if f.outcome == o) for o in ("ok", "violated", "skipped")}
    lines = [
        ", ".join(f"{n} {o}" for o, n in counts.items()) + f"; {result.requests} requests",
        f"endpoint {options.origin}, shape {options.shape}, rootfs "
        f"{options.rootfs or '(default)'}, idle window {options.auto_pause_seconds} s, "
        f"silent commands {options.stream_seconds:g} s",
    ]
    if result.setup_error:
        lines.append(f"not checked: {result.setup_error}")
    if result.stopped:
        lines.append(f"stopped early: {result.stopped}")
    lines.append(f"sandboxes created: {len(result.created)}, deleted: {len(result.deleted)}")
    if result.left_behind:
        lines.append(
            "NOT CONFIRMED DELETED (delete by hand, they may be billed): "
            + ", ".join(result.left_behind)
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    try:
        options = options_from(argv)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except _Refused as exc:
        text = str(exc).replace("\n", f"\n{PROG}: refused: ")
        sys.stderr.write(f"{PROG}: refused: {text}\nusage: {PROG} --api-url URL [options]\n")
        return EXIT_USAGE
    result = RunResult()
    try:
        anyio.run(_run, options, result)
    except KeyboardInterrupt:  # before the signal watcher took over: nothing was created
        result.stopped = "interrupted (SIGINT)"
    secrets = [s for s in (options.api_key, options.second_api_key) if s]
    sys.stdout.write(render(result.findings(), secrets) + "\n" + summary(options, result))
    sys.stdout.flush()
    return exit_code(result)
