"""The Neuron chart's scheduler.enabled: my-scheduler (the name the AWS documents use) calling
neuron-scheduler-extender, and the device plugin's own-Node policy for the device-usage annotation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_render import NEURON_CHART, Rendered, RenderError, container, env_of, template

from neuron_dra.usage_annotation import USAGE_ANNOTATION

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


@pytest.fixture(scope="module")
def with_scheduler(helm: Path) -> Rendered:
    return template(helm, NEURON_CHART, "--set", "scheduler.enabled=true")


def test_scheduler_is_off_by_default(helm: Path) -> None:
    r = template(helm, NEURON_CHART)
    assert r.all("Deployment") == [] and "my-scheduler-config" not in r.names("ConfigMap")


def test_my_scheduler_calls_the_extender_for_both_neuron_resources(with_scheduler: Rendered) -> None:
    config = yaml.safe_load(with_scheduler.get("ConfigMap", "my-scheduler-config")["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["my-scheduler"]
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == "https://neuron-scheduler-extender.kube-system.svc:12345"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["ignorable"], ext["nodeCacheCapable"]) == (
        "filter", "prioritize", False, False)
    assert ext["managedResources"] == [{"name": NEURON, "ignoredByScheduler": False},
                                       {"name": NEURONCORE, "ignoredByScheduler": False}]
    sched = with_scheduler.get("Deployment", "my-scheduler")
    assert sched["metadata"]["namespace"] == "kube-system"
    c = container(sched)
    assert c["command"] == ["kube-scheduler", "--config=/etc/kubernetes/my-scheduler/config.yaml"]
    assert c["image"].startswith("registry.k8s.io/kube-scheduler:v")


def test_extender_deployment_service_and_metrics(with_scheduler: Rendered) -> None:
    dep = with_scheduler.get("Deployment", "neuron-scheduler-extender")
    c = container(dep)
    assert c["command"] == ["neuron-scheduler-extender", "serve"]
    env = env_of(c)
    assert (env["PORT"], env["METRICS_PORT"]) == ("12345", "9813")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"extender": 12345, "metrics": 9813}
    svc = with_scheduler.get("Service", "neuron-scheduler-extender")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"extender": 12345, "metrics": 9813}
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_extender_only_reads_pods_and_nodes(with_scheduler: Rendered) -> None:
    role = with_scheduler.get("ClusterRole", "neuron-scheduler-extender")
    verbs = {(rule["apiGroups"][0], res): set(rule["verbs"]) for rule in role["rules"] for res in rule["resources"]}
    assert verbs == {("", "pods"): {"get", "list", "watch"}, ("", "nodes"): {"get", "list", "watch"}}
    bound = {b["roleRef"]["name"] for b in with_scheduler.all("ClusterRoleBinding")
             if any(s["name"] == "my-scheduler" for s in b["subjects"])}
    assert bound == {"system:kube-scheduler", "system:volume-scheduler"}


def test_scheduler_values_are_checked(helm: Path) -> None:
    with pytest.raises(RenderError, match="scheduler"):
        template(helm, NEURON_CHART, "--set", "scheduler.enable=true")


def test_own_node_policy_lets_the_plugin_write_the_usage_annotation(helm: Path) -> None:
    r = template(helm, NEURON_CHART)
    policy = r.get("ValidatingAdmissionPolicy", "neuron-own-node-keys.default.test")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert USAGE_ANNOTATION in yaml.safe_load(variables["ownedAnnotations"])
