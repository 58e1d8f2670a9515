"""The loopback HTTP server of the test stand-ins (fake iNaturalist, Hub, OpenAI endpoint).

A ``ThreadingHTTPServer`` that does not print a traceback when a client drops its connection: the
suites kill clients mid-request on purpose (SIGKILL, timeouts), and socketserver's default printed
each ``ConnectionResetError`` into the test log as if something had failed. Any other error in a
handler still prints its traceback. (curate's own media server does the same: curate.review.labelstudio.)
"""
from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any

__all__ = ["QuietHTTPServer"]


class QuietHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` (daemon threads) that ignores connections dropped by their clients."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)
