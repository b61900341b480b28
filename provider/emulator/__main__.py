"""CLI: ``python -m provider.emulator [--host] [--port] [--data-dir] [--api-key KEY ...]
[--image NAME=DIR ...]``.

Prints exactly one line on stdout, the base URL, then logs requests to stderr. SIGINT/SIGTERM
stop it cleanly: every sandbox process is killed and the state it owns is removed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import anyio

from .bwrap import BwrapUnavailable
from .images import ImageCatalog, ImageError, parse_specs
from .server import Emulator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m provider.emulator", description="Local CreateOS Sandbox API emulator."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0 = ephemeral)")
    parser.add_argument("--data-dir", default=None, help="state directory (default: a temp dir)")
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="accepted API key (repeatable; default: $CREATEOS_API_KEY or 'test-key')",
    )
    parser.add_argument(
        "--api-key-file",
        default=None,
        help="file with accepted API keys, one per line (# comments allowed)",
    )
    parser.add_argument("--admin-token", default=None, help="X-Emulator-Token for /_emulator/")
    parser.add_argument("--region", default="us", help="region this server serves")
    parser.add_argument(
        "--unshare-net",
        action="store_true",
        help="no network in any sandbox (loopback only), whatever its egress list",
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="rootfs NAME whose sandboxes see the tree of DIR overlaid read-only (repeatable; "
        "may override a built-in name such as devbox:1)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    args = parser.parse_args(argv)
    try:
        args.images = parse_specs(args.image)
        ImageCatalog(args.images)  # names and folders checked before anything starts
    except ImageError as exc:
        parser.error(f"argument --image: {exc}")
    return args


async def serve(args: argparse.Namespace) -> None:
    keys = list(args.api_key or [])
    if args.api_key_file:
        text = await anyio.Path(args.api_key_file).read_text()
        keys += [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    keys = keys or [os.environ.get("CREATEOS_API_KEY") or "test-key"]
    emulator = Emulator(
        api_keys=keys,
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        settings={"region": args.region},
        admin_token=args.admin_token,
        unshare_net=args.unshare_net,
        access_log=not args.quiet,
        images=args.images,
    )
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with emulator:
            print(emulator.base_url, flush=True)
            logging.getLogger("provider.emulator").info(
                "CreateOS emulator on %s (admin token header X-Emulator-Token: %s)",
                emulator.base_url,
                emulator.admin_token if args.admin_token is None else "<given>",
            )
            async for signum in signals:
                logging.getLogger("provider.emulator").info(
                    "stopping on %s", signal.Signals(signum).name
                )
                break


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s emulator %(message)s"
    )
    try:
        anyio.run(serve, args)
    except (BwrapUnavailable, ImageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
