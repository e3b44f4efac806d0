"""A small HTTP server on loopback answering GETs from a table of routes, for tests that make
the product fetch something (image URLs)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# path -> (status, headers, body); status 0 hangs for a few seconds without answering.
Routes = dict[str, tuple[int, dict[str, str], bytes]]


@contextlib.contextmanager
def serving(routes: Routes) -> Iterator[int]:
    """Serve ``routes`` (a dict that may be filled after the port is known); yields the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, headers, body = routes.get(self.path, (404, {}, b"not found"))
            if status == 0:  # hang: the client's timeout must end it
                threading.Event().wait(3)
                return
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
