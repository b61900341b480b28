"""``python -m provider doctor``: a live check of the CreateOS API assumptions the worker makes.

The API documentation leaves several behaviours open (docs/protocol.md C9); the worker
is written against stated assumptions about them. The doctor creates one sandbox on an endpoint,
observes each of those behaviours and prints a table (assumption, observed, ok / violated /
skipped). Modules:

- :mod:`provider.doctor.cli`: arguments, the API keys (from files or ``CREATEOS_API_KEY``, never
  from the command line, never printed), exit codes;
- :mod:`provider.doctor.runner`: the sandbox, the check phases under their deadlines, and the
  shielded, bounded cleanup that runs in every case (errors, Ctrl-C, the overall deadline);
- :mod:`provider.doctor.checks_streams`, :mod:`provider.doctor.checks_sandbox`: the checks;
- :mod:`provider.doctor.wire`: the one place the doctor uses httpx itself (frame timing,
  heartbeats, raw statuses and ``Retry-After`` of every response);
- :mod:`provider.doctor.report`: the findings and the table.
"""
