"""``console``: the operator's console in the browser (broker.console)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from broker.cli.args import PORT, cluster, command
from broker.cli.connection import cluster_settings


def add_console(sub: Any) -> None:
    co = command(
        sub, "console",
        "the operator's console in the browser: overview, dead letters (indexed), redrive, trace, audit",
    )
    cluster(co)
    co.add_argument("--port", type=PORT, default=8080, help="the HTTP port (default 8080; 0: a free one)")
    co.add_argument("--bind", default="127.0.0.1",
                    help="the address to listen on (default 127.0.0.1; another needs tokens)")
    co.add_argument("--tokens", metavar="FILE",
                    help="viewer=TOKEN / operator=TOKEN lines (default: $REPLAYBROKER_CONSOLE_TOKENS; "
                    "none: loopback only, every visitor an operator)")
    co.add_argument("--index", metavar="FILE",
                    help="the SQLite index of NS.dlq (default: NS.console.sqlite here); rebuilt from the topic when missing")
    co.add_argument("--rebuild-index", action="store_true", help="delete the index first and read NS.dlq again")
    co.set_defaults(func=run_console)


def run_console(args: argparse.Namespace) -> int:
    from broker.console.auth import Authenticator, check_bind, load_tokens
    from broker.console.server import build

    # What the console refuses is refused before the cluster is asked anything.
    auth = Authenticator(load_tokens(args.tokens))
    check_bind(args.bind, auth)
    index = Path(args.index or f"{args.namespace}.console.sqlite")
    if args.rebuild_index:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)
    server = build(cluster_settings(args), args.namespace, auth, index_path=index, bind=args.bind, port=args.port)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"replaybroker console of {args.namespace} on http://{args.bind}:{server.port}/ "
          f"({'tokens' if not auth.open else 'no tokens: loopback only'}; index {index})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
