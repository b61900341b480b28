"""The CreateOS Sandbox HTTP API: client, request pacing and the output-stream reader.

Knows the HTTP API only (nothing of JSON-RPC or Paperclip leases). Modules: ``client``
(CreateOSClient, composed of the resource mixins below), ``core`` (transport, pacing, retries,
error mapping: the one httpx boundary), ``sandboxes``, ``processes`` and ``files`` (one
resource's calls each), ``pool`` (shared connection pools), ``pacer`` (request-start spacing
per origin), ``stream`` (follow_process_output), ``models`` (payload types, id rules),
``errors``, ``envelope`` (JSend), ``retry`` (backoff, Retry-After), ``upload`` (file upload
bodies).
"""
