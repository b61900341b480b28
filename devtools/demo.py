"""``python -m devtools.demo``: the whole mission, the way an operator meets it.

Starts the embedded CreateOS emulator (or uses ``--api-url`` with a real key), starts our worker
under the real Paperclip worker manager (the Python stdio host when Node is missing), then walks
one reusable lease through validate, probe, acquire, realize, sync in, a build whose output
streams live, sync out, a warm release (the sandbox stays running until CreateOS pauses it when
idle: the emulator's idle timer is fired, a given endpoint's is not waited for), resume, a
second command, an egress-restricted disposable lease refused a connection to this machine's
loopback, destroy, and a clean worker stop. Prints a transcript with per-step timings and a
summary; exits 1 when any step fails and always destroys the leases it acquired. The key comes
from ``CREATEOS_API_KEY`` or ``--api-key-file`` and is never printed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import anyio

from devtools.demo_hosts import (
    HOST_CHOICES,
    HostReport,
    WorkerHost,
    open_worker_host,
)
from devtools.demo_options import DemoOptions
from devtools.demo_transcript import Transcript
from devtools.demo_walkthrough import DemoFailure, Walkthrough
from provider.config import is_key_text
from provider.emulator import BwrapUnavailable, Emulator

DEFAULT_SHAPE: Final = "s-1vcpu-1gb"
KEY_VARIABLE: Final = "CREATEOS_API_KEY"
CLEANUP_BUDGET_S: Final = 120.0


class UsageError(Exception):
    """Bad command-line input; the message says what to fix."""


def parse_args(argv: list[str] | None = None) -> DemoOptions:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.demo",
        description="Walk a CreateOS sandbox through the Paperclip environment verbs.",
    )
    parser.add_argument("--api-url", help="a real CreateOS endpoint (default: embedded emulator)")
    parser.add_argument(
        "--api-key-file", type=Path, help=f"file holding the API key (default: ${KEY_VARIABLE})"
    )
    parser.add_argument("--shape", default=DEFAULT_SHAPE, help=f"sandbox shape ({DEFAULT_SHAPE})")
    parser.add_argument("--rootfs", default=None, help="catalog image or template (optional)")
    parser.add_argument(
        "--host",
        choices=HOST_CHOICES,
        default="auto",
        help="who runs the worker: the real worker manager (node), the Python host, or auto",
    )
    parser.add_argument("--keep", action="store_true", help="keep the demo's temp folder")
    args = parser.parse_args(argv)
    if args.api_url is None:
        if args.api_key_file is not None:
            raise UsageError("--api-key-file goes with --api-url (the emulator gets its own key)")
        key = secrets.token_urlsafe(18)
    else:
        key = _read_key(args.api_key_file)
    return DemoOptions(args.api_url, key, args.shape, args.rootfs, args.host, args.keep)


def _read_key(key_file: Path | None) -> str:
    if key_file is not None:
        try:
            key = key_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --api-key-file: {exc.strerror}") from None
    else:
        key = os.environ.get(KEY_VARIABLE, "").strip()
    if not key:
        raise UsageError(f"--api-url needs a key: set {KEY_VARIABLE} or pass --api-key-file")
    if not is_key_text(key):
        where = "--api-key-file" if key_file is not None else KEY_VARIABLE
        raise UsageError(f"{where} holds spaces, control or non-ASCII characters: give the key")
    return key


async def run_demo(options: DemoOptions, transcript: Transcript, work_dir: Path) -> bool:
    """The whole demo; True when every step passed (the lease is destroyed either way)."""
    transcript.add_secret(options.api_key)
    endpoint = options.api_url or "the embedded CreateOS emulator (bubblewrap sandboxes)"
    transcript.banner(
        "CreateOS sandbox provider for Paperclip: demo",
        [
            ("endpoint", endpoint),
            ("shape", options.shape + (f", rootfs {options.rootfs}" if options.rootfs else "")),
            ("API key", "set (never printed)"),
            ("work folder", str(work_dir)),
        ],
    )
    report = HostReport()
    ok = False
    async with AsyncExitStack() as stack:
        walk: Walkthrough | None = None
        try:
            emulator: Emulator | None = None
            with transcript.step("Start the CreateOS endpoint"):
                if options.api_url is None:
                    emulator = Emulator(api_keys=[options.api_key])
                    await stack.enter_async_context(emulator)
                    api_url = emulator.base_url
                    transcript.detail("emulator", f"{api_url} (sandboxes are bwrap processes)")
                else:
                    api_url = options.api_url
                    transcript.detail("CreateOS", f"{_origin(api_url)} (given with --api-url)")
            host_stack = AsyncExitStack()
            stack.push_async_callback(host_stack.aclose)
            with transcript.step("Start the worker under the host"):
                host: WorkerHost = await host_stack.enter_async_context(
                    open_worker_host(
                        options.host, log_dir=work_dir, report=report, notice=transcript.note
                    )
                )
                transcript.detail("host", host.name)
                transcript.detail("worker pids", " ".join(map(str, host.worker_pids)) or "?")
                transcript.detail("ready after", f"{host.start_ms:.0f} ms")
                transcript.detail("verbs", f"{len(host.supported_methods)} supported methods")
            walk = Walkthrough(host, transcript, emulator, work_dir, api_url, options)
            try:
                await walk.run()
            finally:
                await walk.cleanup()
            with transcript.step("Stop the worker (shutdown)"):
                await host_stack.aclose()
                if report.processes_left:
                    raise DemoFailure(f"worker processes left running: {report.processes_left}")
                transcript.detail("processes", "none left running")
            ok = walk.cleanup_ok
        except (DemoFailure, BwrapUnavailable) as exc:
            if isinstance(exc, BwrapUnavailable):
                transcript.note(f"bubblewrap cannot sandbox here: {exc}")
        except Exception:  # a failed call or step: already shown under its step
            transcript.note("stopping: the step above failed")
    transcript.print()
    transcript.summary(ok=ok, facts=walk.facts(report) if walk is not None else [])
    return ok


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL, for display: never its user info, path or query."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unparsable URL: validation will say why)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    work_dir = Path(tempfile.mkdtemp(prefix="createos-demo-"))
    transcript = Transcript()
    ok = False
    interrupted = False
    try:
        ok = anyio.run(run_demo, options, transcript, work_dir)
    except KeyboardInterrupt:
        interrupted = True
        transcript.print("  interrupted (the lease, if any, was destroyed on the way out)")
    finally:
        if ok and not options.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            transcript.print(f"  logs and files kept in {work_dir}")
    return 130 if interrupted else 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
