"""moto's S3 server with conditional writes made atomic, as S3 makes them.

moto checks ``If-None-Match`` / ``If-Match`` and then writes, without one lock around the two:
two create-only puts of one key that arrive together can both pass the check and both answer
200 (seen once in a suite run: two winners of one sequence claim). Real S3 decides such a race
for exactly one writer, and the commit protocol relies on that, so the tests run moto's own WSGI
application behind one lock taken by every request that carries a precondition. Everything else
(plain puts, reads, lists) stays concurrent. Run as ``python _moto_atomic.py -H HOST -p PORT``.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")


def atomic_conditional_writes(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    """Wrap a WSGI app so that requests with a precondition run one at a time, check and write."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if any(environ.get(name) for name in _CONDITIONS):
            with lock:
                return list(app(environ, start_response))
        return list(app(environ, start_response))

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        atomic_conditional_writes(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
