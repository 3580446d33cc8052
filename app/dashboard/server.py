"""Building and serving the dashboard.

``create_app`` is what tests and ``kvscope dash`` share. ``Server`` binds the
socket itself and serves with werkzeug rather than ``Dash.run``, so a port in
use is one clear error before anything starts, and tests can run it on a
thread and stop it.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from pathlib import Path

from dash import Dash
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from kvscope.app.dashboard import callbacks, layout
from kvscope.db.source import reader
from kvscope.engine.errors import KvscopeError

ASSETS = Path(__file__).with_name("assets")


def create_app(db_path: str | os.PathLike[str], refresh_ms: int = 2000) -> Dash:
    """The dashboard for the database at ``db_path``, refreshing every ``refresh_ms``.

    Raises KvscopeError if there is no kvscope database there (the app reads,
    never creates). Scripts and styles are served by the app itself, so it
    works with no network access.
    """
    db_path = Path(db_path)
    with reader(db_path):  # fail now, in one line, not on the first page load
        pass
    app = Dash(
        __name__,
        title="kvscope",
        assets_folder=str(ASSETS),
        suppress_callback_exceptions=True,  # page components appear only on their page
        update_title=None,
        serve_locally=True,
    )
    app.layout = layout.shell(db_path, refresh_ms)
    callbacks.register(app, db_path)
    return app


class _QuietHandler(WSGIRequestHandler):
    """No line per request: a live dashboard polls every few seconds."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class Server:
    """The app behind a threaded WSGI server on ``host:port`` (port 0: any free one)."""

    def __init__(self, app: Dash, host: str = "127.0.0.1", port: int = 8050) -> None:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            listener = socket.create_server((host, port), family=family)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise KvscopeError(
                    f"port {port} on {host} is in use; choose another with --port"
                ) from None
            raise KvscopeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        # werkzeug would print its own message and exit on a failed bind: hand it
        # a socket that is already bound.
        with listener:
            self._server: BaseWSGIServer = make_server(
                host,
                port,
                app.server,
                threaded=True,
                request_handler=_QuietHandler,
                fd=listener.fileno(),
            )
        self.host = host
        self.port = self._server.socket.getsockname()[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        # an IPv6 literal goes in brackets (http://::1:8050/ is no address a browser opens)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> Server:
        """Serve on a background thread (tests, screenshots)."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
