"""`labkube operator`: the Kubernetes operator a cluster runs (the Helm chart's deployment), from its config file.
`labkube crds apply` is in labkube/crds_cli.py."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
import yaml
from pydantic import ValidationError

from labkube.cli_checks import UsageFailure, first_validation_error


@click.command("operator")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The operator's config (OperatorConfig, camelCase YAML); default /etc/labkube/operator.yaml.",
)
@click.option("--kube-context", default=None, help="Use this kubeconfig context instead of the pod's service account.")
@click.option(
    "--runs-root",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where campaign directories go (default $LABKUBE_RUNS_ROOT, else the config's runsRoot, /runs).",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=None,
    help="GPUs Ray may hand out at once (the cluster's); default: only the Kubernetes scheduler bounds GPUs.",
)
@click.option(
    "--max-runs", type=click.IntRange(min=1), default=1000, show_default=True, help="Runs supervised at once in all."
)
@click.option("--verbose", is_flag=True, help="Debug logging.")
def operator_command(
    config_file: Path | None,
    kube_context: str | None,
    runs_root: Path | None,
    gpus: int | None,
    max_runs: int,
    verbose: bool,
) -> None:
    """Run the Kubernetes operator: Campaign resources become Runs and pods (what the Helm chart runs)."""
    import os

    from labkube.operator import DriverError
    from labkube.operator.k8s_models import OperatorConfig
    from labkube.operator.k8s_operator import OperatorError, OperatorRuntime, run_operator
    from labkube.operator.kube import KubeError, KubeTarget, default_namespace

    path = config_file or Path("/etc/labkube/operator.yaml")
    if not path.exists():
        raise UsageFailure(f"{path}: no operator config; pass --config FILE (the Helm chart mounts one)")
    try:
        config = OperatorConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError:
        raise UsageFailure(f"{path}: not valid YAML") from None
    except ValidationError as exc:
        raise UsageFailure(first_validation_error(exc, str(path))) from None
    root = runs_root or Path(os.environ.get("LABKUBE_RUNS_ROOT") or config.runs_root)
    target = KubeTarget(context=kube_context)
    namespace = os.environ.get("LABKUBE_OPERATOR_NAMESPACE") or None
    if namespace is None:
        with contextlib.suppress(KubeError):
            namespace = default_namespace(target)
    runtime = OperatorRuntime(config=config, kube=target, runs_root=root, namespace=namespace)
    try:
        run_operator(runtime, gpus=gpus, max_runs=max_runs, verbose=verbose)
    except (KubeError, DriverError, OperatorError) as exc:
        raise UsageFailure(str(exc)) from None
