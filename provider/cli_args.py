"""Argument parsing shared by the operator subcommands (``shell``, ``doctor``): argparse whose
errors become a :class:`Refused` exception, so each command prints its own refusal and returns
its usage exit code instead of argparse exiting the process."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Refused(Exception):
    """A usage error: the message names the fix, never a secret."""


class RefusingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(message)
