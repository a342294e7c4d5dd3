"""`labkube crds apply [--kube-context NAME]`: upgrade the Campaign and Run CRDs in a cluster (registered by
labkube/cli.py). Helm installs a chart's `crds/` on the first install only and never upgrades them; this applies
the CRDs of the installed labkube, server-side, before `helm upgrade` (helm/labkube/README.md, docs/kubernetes.md)."""

from __future__ import annotations

import click
from rich.console import Console

from labkube.cli_checks import UsageFailure

console = Console()


@click.group("crds")
def crds() -> None:
    """The Campaign and Run CustomResourceDefinitions."""


@crds.command("apply")
@click.option("--kube-context", default=None, help="kubeconfig context to use (default: the current one).")
def crds_apply(kube_context: str | None) -> None:
    """Server-side apply this labkube's CRDs (Helm never upgrades a chart's crds/). Needs rights on
    customresourcedefinitions, a cluster admin's."""
    from labkube.operator.crds import FIELD_MANAGER, apply_crds
    from labkube.operator.kube import KubeError, KubeTarget, api_client, check_reachable

    target = KubeTarget(context=kube_context)
    try:
        client = api_client(target)
        check_reachable(client, target)
        outcomes = apply_crds(client)
    except KubeError as exc:
        raise UsageFailure(str(exc)) from None
    for name, outcome in outcomes:
        console.print(f"customresourcedefinition {name}: {outcome}", highlight=False)
    console.print(
        f"applied server-side as field manager `{FIELD_MANAGER}` to {client.configuration.host}", highlight=False
    )
