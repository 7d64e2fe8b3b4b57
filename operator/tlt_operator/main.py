"""`tlt-operator`: run the kopf operator with its metrics and health endpoints (tunables: the
environment variables in `tlt_operator.settings`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re

import kopf
import prometheus_client

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tlt-operator",
        description="Run the TLT operator (kopf) with its metrics and health endpoints.",
        epilog="Tunables: TLT_OPERATOR_NAMESPACES, TLT_OPERATOR_RECONCILE_SECONDS, TLT_OPERATOR_REQUEST_TIMEOUT, "
        "TLT_OPERATOR_WATCH_SECONDS (see tlt_operator.settings).",
    )
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port (/healthz)")
    parser.add_argument(
        "--listen-address",
        default="0.0.0.0",
        help="address the metrics and health endpoints bind to (default: all; the kubelet probes the pod IP)",
    )
    parser.add_argument(
        "--print-rbac",
        metavar="NAMESPACES",
        help="print the Role and RoleBinding of a namespace-scoped install for these comma-separated "
        "namespaces (kubectl apply -f -) and exit; run the operator with TLT_OPERATOR_NAMESPACES "
        "set to the same list",
    )
    parser.add_argument(
        "--operator-namespace",
        default="tlt-system",
        help="with --print-rbac: the namespace of the operator's ServiceAccount",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _print_rbac(parser: argparse.ArgumentParser, namespaces: str, operator_namespace: str) -> int:
    import yaml

    from .rbac import namespaced_rbac

    listed = [n.strip() for n in namespaces.split(",") if n.strip()]
    bad = [n for n in [*listed, operator_namespace] if not _DNS_LABEL.fullmatch(n)]
    if not listed or bad:
        parser.error(
            f"--print-rbac: namespaces must be DNS labels (lowercase letters, digits, '-', at most 63), "
            f"comma-separated; got {bad or [namespaces]}"
        )
    print(yaml.safe_dump_all(namespaced_rbac(listed, operator_namespace), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.print_rbac is not None:
        return _print_rbac(parser, args.print_rbac, args.operator_namespace)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from . import handlers  # noqa: F401  (registers the handlers)
    from .settings import namespaces

    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port, addr=args.listen_address)
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not namespaces(),
            namespaces=namespaces(),
            liveness_endpoint=f"http://{args.listen_address}:{args.health_port}/healthz",
        )
    )
    return 0
