"""The Kubernetes manifest, checked without a cluster: every resource against the Kubernetes API schema
(kubernetes-validate, which ships the schemas: no network), and its wiring: one PostgreSQL, an Indexed
Job of one-GPU workers, the storage URL only from a Secret, real `tuner` commands on real files."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO
from tuner.cli.main import app
from tuner.store.urls import STORAGE_ENV

MANIFEST = REPO / "docker" / "kubernetes.yaml"
KUBERNETES = "1.30"  # the oldest release the manifest is written for (backoffLimitPerIndex)


@pytest.fixture(scope="module")
def resources() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def _one(resources: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    (found,) = [
        r
        for r in resources
        if r["kind"] == kind
        and (component is None or r["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]
    return found


def _pods(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["spec"]["template"]["spec"] for r in resources if r["kind"] in ("Job", "Deployment", "StatefulSet")]


def test_every_resource_validates_against_the_kubernetes_schema(resources: list[dict[str, Any]]) -> None:
    assert {r["kind"] for r in resources} == {"Service", "StatefulSet", "PersistentVolumeClaim", "Job", "Deployment"}
    for r in resources:
        kubernetes_validate.validate(r, KUBERNETES, strict=True)  # raises on a wrong type or an unknown field
    typo = copy.deepcopy(_one(resources, "Job"))
    typo["spec"]["template"]["spec"]["containers"][0]["resource"] = typo["spec"]["template"]["spec"]["containers"][
        0
    ].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(typo, KUBERNETES, strict=True)


def test_an_indexed_job_runs_one_worker_per_gpu_against_one_postgresql(resources: list[dict[str, Any]]) -> None:
    job = _one(resources, "Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == job["spec"]["completions"] >= 1
    (worker,) = job["spec"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert worker["args"][0] == "run" and worker["args"][worker["args"].index("--gpus") + 1] == "0"
    database = _one(resources, "StatefulSet", "database")
    assert (
        database["spec"]["replicas"] == 1
        and database["spec"]["serviceName"] == _one(resources, "Service", "database")["metadata"]["name"]
    )
    (postgres,) = database["spec"]["template"]["spec"]["containers"]
    assert postgres["image"].startswith("postgres:")
    assert [e for e in postgres["env"] if e["name"] == "POSTGRES_PASSWORD"][0]["valueFrom"]["secretKeyRef"][
        "name"
    ] == "route-tuner-db"


def test_the_storage_url_comes_only_from_the_secret(resources: list[dict[str, Any]]) -> None:
    urls = re.findall(r"[a-z0-9+]+://\S*", MANIFEST.read_text())
    assert urls == [
        "postgresql+psycopg2://tuner:change-me@route-tuner-postgres:5432/tuner'"
    ]  # the comment's example only
    refs = set()
    for pod in _pods(resources):
        for container in pod.get("initContainers", []) + pod["containers"]:
            if container["image"].startswith("route-tuner-"):
                (env,) = [e for e in container["env"] if e["name"] == STORAGE_ENV]
                assert "value" not in env
                ref = env["valueFrom"]["secretKeyRef"]
                refs.add((ref["name"], ref["key"]))
                assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert "securityContext" not in pod or pod["securityContext"].get("runAsNonRoot", True)
    assert refs == {("route-tuner-db", "storage")}
    assert all(
        r["spec"].get("type", "ClusterIP") == "ClusterIP" for r in resources if r["kind"] == "Service"
    )  # nothing exposed


def test_every_command_is_a_real_tuner_command_on_a_study_file_that_exists(resources: list[dict[str, Any]]) -> None:
    for pod in _pods(resources):
        for container in pod.get("initContainers", []) + pod["containers"]:
            if not container["image"].startswith("route-tuner-"):
                continue
            args = container["args"]
            words = args[:2] if args[0] == "db" else args[:1]
            helptext = CliRunner().invoke(app, [*words, "--help"], terminal_width=200).output
            assert all(o in helptext for o in args if o.startswith("--")), args
            spec = Path(container["workingDir"]) / next(a for a in args if a.endswith(".toml"))
            mounts = {m["mountPath"]: m["subPath"] for m in container["volumeMounts"]}
            mount = next(m for m in mounts if spec.is_relative_to(m))
            assert (REPO / mounts[mount] / spec.relative_to(mount)).is_file(), spec
    for pod in _pods(resources):
        claims = {
            v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v
        }
        assert claims <= {_one(resources, "PersistentVolumeClaim")["metadata"]["name"]}
    assert _one(resources, "PersistentVolumeClaim")["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]  # one work dir for every pod
