"""``replaybroker bench`` arguments and entry point.

Kept free of heavy imports: ``broker.cli`` builds this parser for every command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from broker.bench.figures import DEFAULT_SECTIONS, SECTIONS, default_results_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI smoke size (a few minutes); 10^7 fold skipped")
    parser.add_argument("--smoke", action="store_true",
                        help="--quick, smaller still: the harness's own test (its figures are no measurement)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure on stdout")
    parser.add_argument("--bootstrap", help="Kafka to use (default: KAFKA_BOOTSTRAP_SERVERS, else an embedded one)")
    parser.add_argument("--results-dir", type=Path, default=default_results_dir(),
                        help="where results go (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every topic")
    parser.add_argument("--only", nargs="+", choices=SECTIONS,
                        help="run only these sections (default: all but scale, which runs only when named)")
    parser.add_argument("--profile", action="store_true",
                        help="run every process under pyinstrument; text profiles next to the results")
    parser.add_argument("--skip-share", action="store_true", help="do not run the share-group baseline")
    parser.add_argument("--commit-interval-ms", type=int, default=100, help="the acker's commit interval, ms")
    parser.add_argument("--replay-timeout-ms", type=int,
                        help="per-record timeout of the replay run (default: 2000 with --quick, else 10000)")
    parser.add_argument("--count-requests", action="store_true", default=None,
                        help="count the broker's requests on a given local broker too (default: only on the "
                             "bench's own; a shared broker's counts include other clients')")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def main_bench(args: argparse.Namespace) -> int:
    import orjson

    from broker.bench.runner import Options, run

    options = Options(
        quick=args.quick,
        smoke=args.smoke,
        json=args.json,
        bootstrap=args.bootstrap,
        results_dir=args.results_dir,
        partitions=args.partitions,
        sections=tuple(args.only) if args.only else DEFAULT_SECTIONS,
        profile=args.profile,
        skip_share=args.skip_share,
        commit_interval_ms=args.commit_interval_ms,
        replay_timeout_ms=args.replay_timeout_ms,
        progress=not args.no_progress,
        count_requests=args.count_requests,
    )
    result = run(options)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        sys.stdout.write(Path(result["files"]["markdown"]).read_text())
    return 1 if result["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m broker.bench.cli``: the same as ``replaybroker bench``."""
    import logging

    from broker.bench import runner

    parser = argparse.ArgumentParser(prog="replaybroker bench", description=runner.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return main_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
