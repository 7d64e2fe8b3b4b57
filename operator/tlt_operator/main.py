"""`tlt-operator`: run the kopf operator with its metrics and health endpoints (tunables: the
environment variables in `tlt_operator.settings`)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf
import prometheus_client


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tlt-operator", description="Run the TLT operator (kopf) with its metrics and health endpoints.",
        epilog="Tunables: TLT_OPERATOR_NAMESPACES, TLT_OPERATOR_RECONCILE_SECONDS, TLT_OPERATOR_REQUEST_TIMEOUT, "
        "TLT_OPERATOR_WATCH_SECONDS (see tlt_operator.settings).")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port (/healthz)")
    parser.add_argument("--listen-address", default="0.0.0.0",
                        help="address the metrics and health endpoints bind to "
                        "(default: all; the kubelet probes the pod IP)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from . import handlers  # noqa: F401  (registers the handlers)
    from .settings import namespaces

    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port, addr=args.listen_address)
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not namespaces(),
        namespaces=namespaces(),
        liveness_endpoint=f"http://{args.listen_address}:{args.health_port}/healthz",
    ))
    return 0
