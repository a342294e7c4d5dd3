"""`labkube crds apply`: the CRD upgrade path Helm lacks (it installs a chart's crds/ once and never upgrades them),
run as a subprocess against the fake API server with the real `kubernetes` client.

Where the fake is more lenient than kube-apiserver (fakekube.py's docstring): it keeps no `managedFields`, so a field
another manager owns (the `helm` manager, for CRDs `helm install` created) is never a 409 Conflict; the command
applies with `force` because a real server would answer one. And it merges the applied object as a JSON merge
patch, so a field removed from a CRD is not removed by the apply here, where the real server removes the fields
this field manager applied before; the tests below change and add fields, never remove one."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from conftest import CAMPAIGNS
from fakekube import CRDS, FakeKube, KubeError
from test_cli_k8s import kubeconfig, labkube_async

from labkube.operator.crds import API_VERSION, FIELD_MANAGER, campaign_crd, run_crd

CAMPAIGN_CRD = "campaigns.labkube.dev"
RUN_CRD = "runs.labkube.dev"


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeKube, str]]:
    async with FakeKube() as fake, kmock.Server(fake) as server:
        yield fake, str(server.url).rstrip("/")
        fake.close_watches()


def older_campaign_crd() -> dict[str, Any]:
    """The Campaign CRD of an older chart: no `spec.pod` and one printer column fewer."""
    crd = copy.deepcopy(campaign_crd())
    version = crd["spec"]["versions"][0]
    del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["pod"]
    version["additionalPrinterColumns"] = version["additionalPrinterColumns"][:-1]
    return crd


def campaign_with_pod(name: str) -> dict[str, Any]:
    spec = {"tasks": ["t"], "models": ["oracle"], "pod": {"priorityClassName": "research"}}
    return {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}


async def crds_apply(url: str, tmp_path: Any) -> tuple[int, str, str]:
    config = kubeconfig(tmp_path / "kubeconfig", url)
    return await labkube_async("crds", "apply", "--kube-context", "fake", env={"KUBECONFIG": str(config)}, cwd=tmp_path)


async def test_crds_apply_upgrades_the_crds_helm_installed_once(api: tuple[FakeKube, str], tmp_path: Any) -> None:
    fake, url = api
    old = older_campaign_crd()
    fake.update_object(CRDS, "", CAMPAIGN_CRD, lambda crd: crd.update(spec=old["spec"]))
    # What `helm upgrade` leaves: the old schema is served, and prunes a field the new operator reads.
    assert "pod" not in fake.create_object(CAMPAIGNS, "default", campaign_with_pod("before"))["spec"]

    code, out, err = await crds_apply(url, tmp_path)
    assert code == 0, err + out
    assert f"customresourcedefinition {CAMPAIGN_CRD}: updated" in out
    assert f"customresourcedefinition {RUN_CRD}: unchanged" in out
    assert f"applied server-side as field manager `{FIELD_MANAGER}` to {url}" in out
    stored = fake.read_object(CRDS, "", CAMPAIGN_CRD)
    assert stored is not None and stored["spec"] == campaign_crd()["spec"]
    assert stored["metadata"]["labels"] == campaign_crd()["metadata"]["labels"]
    # The API serves the new schema: the field is kept now.
    after = fake.create_object(CAMPAIGNS, "default", campaign_with_pod("after"))
    assert after["spec"]["pod"] == {"priorityClassName": "research"}
    applies = [r for r in list(fake) if r.method.value == "PATCH"]
    assert {r.headers.get("Content-Type", "").split(";")[0] for r in applies} == {"application/apply-patch+yaml"}
    assert all(r.params.get("fieldManager") == FIELD_MANAGER and r.params.get("force") == "true" for r in applies)

    code, out, err = await crds_apply(url, tmp_path)  # again: nothing to do
    assert code == 0, err + out
    assert f"{CAMPAIGN_CRD}: unchanged" in out and f"{RUN_CRD}: unchanged" in out


async def test_crds_apply_creates_crds_that_are_missing(api: tuple[FakeKube, str], tmp_path: Any) -> None:
    """E.g. after `helm install --skip-crds`."""
    fake, url = api
    for name in (CAMPAIGN_CRD, RUN_CRD):
        fake.delete_object(CRDS, "", name)
    code, out, err = await crds_apply(url, tmp_path)
    assert code == 0, err + out
    assert f"{CAMPAIGN_CRD}: created" in out and f"{RUN_CRD}: created" in out
    for name, crd in ((CAMPAIGN_CRD, campaign_crd()), (RUN_CRD, run_crd())):
        stored = fake.read_object(CRDS, "", name)
        assert stored is not None and stored["spec"] == crd["spec"]


async def test_crds_apply_without_rights_is_one_line(api: tuple[FakeKube, str], tmp_path: Any) -> None:
    fake, url = api

    def forbidden(request: Any) -> None:
        raise KubeError(
            403,
            f'customresourcedefinitions.apiextensions.k8s.io "{CAMPAIGN_CRD}" is forbidden: User "dev" cannot patch '
            'resource "customresourcedefinitions" in API group "apiextensions.k8s.io" at the cluster scope',
            "Forbidden",
        )

    fake[kmock.action.UPDATE, kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions")] << forbidden
    code, out, err = await crds_apply(url, tmp_path)
    assert code == 2, out + err
    assert f"CustomResourceDefinition {CAMPAIGN_CRD}: the Kubernetes API at {url} answered 403 Forbidden" in err
    assert "apply them with a cluster admin's context (--kube-context)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3


async def test_crds_apply_without_a_cluster_is_one_line(tmp_path: Any) -> None:
    code, out, err = await crds_apply("http://127.0.0.1:9", tmp_path)
    assert code == 2, out + err
    assert "cannot reach the Kubernetes API at http://127.0.0.1:9 (context fake)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
