"""``python3 -m provider shell``: attach the operator's terminal to a shell in a sandbox.

The helper named by the ``createos_shell`` connection payload (docs/protocol.md 8.1): an
operator runs ``python3 -m provider shell --api-url '<origin>' '<sandbox id>'`` in their own
terminal to prepare a template sandbox. Modules:

- :mod:`provider.shell.cli`: arguments, the key from ``CREATEOS_API_KEY`` and the URL check, all
  before any HTTP request (standard library and light imports only until they pass);
- :mod:`provider.shell.terminal`: the local terminal (size, raw mode, status lines);
- :mod:`provider.shell.session`: the relay itself, on anyio (a PTY process ``/bin/bash -l`` in
  ``/paperclip-workspace``, keystrokes to ``/input``, ``pty`` frames to stdout, SIGWINCH to
  ``/resize``, the exit code, and the process deleted on every way out).

Nothing is imported here, so ``python -m provider`` (the worker) never pays for this package.
"""
