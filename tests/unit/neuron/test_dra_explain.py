"""``explain`` without a cluster: the CEL environment DRA selectors get, and the per-node verdicts on the slices the
real ``slices`` command prints for fake hosts (trn2.48xlarge: a 4x4 torus, rows of 4 devices; trn1.32xlarge;
trn2u.48xlarge with the UltraServer ``neuron-node`` sharing the chips' counter). The same verdicts are checked
against kube-scheduler in tests/e2e/test_dra_explain_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from accel_core.dra.explain import ClaimSpec, Explainer
from accel_core.dra.explain_cel import CelRuntimeError, CelUnsupported, compile_selector, device_variable
from accel_core.fakehost import build_host
from efa_plugin.dra import cli as efa_cli
from neuron_dra.dra import cli as neuron_cli
from neuron_dra.dra.explain_hints import NEURON_EXPLAIN_HINTS

DRIVER = "neuron.aws.com"
CLASS = {"metadata": {"name": DRIVER}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
TRN2 = f"device.attributes['{DRIVER}'].instanceType == 'trn2.48xlarge'"


def slices_of(tmp: Path, node: str, instance_type: str, capsys: pytest.CaptureFixture[str], **opts: Any) -> Path:
    build_host(tmp / node, instance_type, **opts)
    assert neuron_cli.main(["slices", "--host-root", str(tmp / node), "--node-name", node]) == 0
    out = tmp / f"{node}.json"
    out.write_text(capsys.readouterr().out)
    return out


def load(path: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(path.read_text())
    return data


def claim(count: int | None = None, *, selectors: tuple[str, ...] = (TRN2,), constraints: Any = (),
          first_available: Any = None, tolerations: Any = None) -> dict[str, Any]:
    if first_available:
        request: dict[str, Any] = {"name": "neurons", "firstAvailable": first_available}
    else:
        body: dict[str, Any] = {"deviceClassName": DRIVER,
                                "selectors": [{"cel": {"expression": e}} for e in selectors]}
        body.update({"count": count} if count else {"allocationMode": "All"})
        if tolerations:
            body["tolerations"] = tolerations
        request = {"name": "neurons", "exactly": body}
    return {"devices": {"requests": [request], "constraints": list(constraints)}}


def verdicts(spec: dict[str, Any], slices: list[dict[str, Any]], allocated: Any = None) -> dict[str, Any]:
    e = Explainer([ClaimSpec("c", spec)], {DRIVER: CLASS}, slices, allocated or {}, NEURON_EXPLAIN_HINTS)
    return {n: e.explain_node(n) for n in e.nodes()}


@pytest.fixture
def trn2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    return slices_of(tmp_path, "t2", "trn2.48xlarge", capsys)


# -- CEL ------------------------------------------------------------------------------------------------------------
def test_selectors_see_what_kubernetes_gives_them(trn2: Path) -> None:
    [published] = load(trn2)
    dev = device_variable(DRIVER, published["spec"]["devices"][5])
    assert compile_selector(TRN2).matches(dev)
    assert compile_selector(f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].deviceId == 5').matches(dev)
    # qualified names keep their domain; unqualified ones are in the driver's
    assert compile_selector("device.attributes['resource.aws.com'].devicegroup1_id == '0000:57:00.0'").matches(dev)
    # a domain the device lacks is an empty map (Kubernetes), so has() is false, not an error
    assert not compile_selector("has(device.attributes['gpu.example.com'].model)").matches(dev)
    with pytest.raises(CelRuntimeError, match="no such key: model"):
        compile_selector(f"device.attributes['{DRIVER}'].model == 'x'").matches(dev)
    # versions and quantities compare as values
    assert compile_selector(f"device.attributes['{DRIVER}'].draDriverVersion.isGreaterThan(semver('0.0.9'))"
                            ).matches(dev)
    assert compile_selector("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))").matches(dev)
    assert compile_selector("semver('v1.2', true) == semver('1.2.0')").matches(dev)
    assert compile_selector("quantity('1Gi') == quantity('1024Mi') && quantity('1.5').isGreaterThan("
                            "quantity('1500m')) == false && quantity('2k').asInteger() == 2000").matches(dev)
    capacity = device_variable(DRIVER, {"name": "d", "capacity": {"memory": {"value": "96Gi"}}})
    assert compile_selector(f"device.capacity['{DRIVER}'].memory.compareTo(quantity('64Gi')) > 0").matches(capacity)


def test_the_strings_library_parts_selectors_use(trn2: Path) -> None:
    [published] = load(trn2)
    dev = device_variable(DRIVER, published["spec"]["devices"][5])
    for expression in (
            f"device.attributes['{DRIVER}'].deviceName.lowerAscii() == 'trainium2'",
            f"device.attributes['{DRIVER}'].instanceType.split('.')[0] == 'trn2'",
            f"device.attributes['{DRIVER}'].instanceType.split('.', 1) == ['trn2.48xlarge']",
            f"device.attributes['{DRIVER}'].instanceType.indexOf('.') == 4",
            f"device.attributes['{DRIVER}'].instanceType.substring(0, 4).upperAscii() == 'TRN2'",
            "['a', 'b'].join('-') == 'a-b' && ' x '.trim() == 'x' && 'aXa'.replace('a', 'b') == 'bXb'",
            "'ÄB'.lowerAscii() == 'Äb' && 'abc'.charAt(3) == '' && 'abab'.lastIndexOf('ab') == 2"):
        assert compile_selector(expression).matches(dev), expression


@pytest.mark.parametrize(("expression", "message"), [
    ("device.driver.format([]) == 'x'", "format: not in explain's CEL environment"),
    (f"cel.bind(d, device.attributes['{DRIVER}'], d.deviceId == 1)", "cel.bind is not supported"),
    ("other.x == 1", "unknown variable other"),
    ("device.driver ==", "does not compile"),
])
def test_what_explain_cannot_evaluate_is_named(expression: str, message: str) -> None:
    with pytest.raises(CelUnsupported, match=message):
        compile_selector(expression)


# -- verdicts ---------------------------------------------------------------------------------------------------------
def test_five_connected_names_the_connected_sizes(trn2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    trn1 = slices_of(tmp_path, "t1", "trn1.32xlarge", capsys)
    five = tmp_path / "five.yaml"
    five.write_text(yaml.safe_dump_all([CLASS | {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"}, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "five"},
        "spec": {"spec": claim(5, constraints=[{"requests": ["neurons"],
                                                "matchAttribute": "resource.aws.com/devicegroup4_id"}])}}]))
    assert neuron_cli.main(["explain", "-f", str(five), "--slices", str(trn2), "--slices", str(trn1)]) == 0
    out = capsys.readouterr().out
    assert "verdict: fits on 0 of 2 node(s)" in out
    assert "node t2: does not fit\n  - request neurons: 16 free matching devices for 5\n" in out
    assert "no set of 5 free matching devices shares one value; the node's free devices group by value as " \
           "4+4+4+4. Connected Neuron device sets come in sizes 1, 4, 8 and 16" in out
    assert f"node t1: does not fit\n  - request neurons: no device matches: selector #0 of the request `{TRN2}` " \
           "rejects 16 (neuron-device-0..15)" in out


def test_four_connected_fits_on_a_free_torus_row(trn2: Path) -> None:
    row = [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]
    held = {(DRIVER, "t2", f"neuron-device-{i}"): "ns/other" for i in (0, 5, 9)}
    [v] = verdicts(claim(4, constraints=row), load(trn2), held).values()
    assert v.fits and [d[2] for _, _, d in v.chosen] == [f"neuron-device-{i}" for i in range(12, 16)]
    held[(DRIVER, "t2", "neuron-device-13")] = "ns/other"
    [v] = verdicts(claim(4, constraints=row), load(trn2), held).values()
    assert v.fits is False
    assert any("group by value as 3+3+3+3" in r for r in v.reasons), v.reasons


def test_prioritized_list_falls_back_to_four(trn2: Path) -> None:
    spec = claim(first_available=[
        {"name": "eight", "deviceClassName": DRIVER, "count": 8},
        {"name": "four", "deviceClassName": DRIVER, "count": 4}], constraints=[
        {"requests": ["neurons/eight"], "matchAttribute": "resource.aws.com/devicegroup8_id"},
        {"requests": ["neurons/four"], "matchAttribute": "resource.aws.com/devicegroup4_id"}])
    held = {(DRIVER, "t2", f"neuron-device-{i}"): "ns/other" for i in range(9)}  # rows 0, 1 and one of row 2
    [v] = verdicts(spec, load(trn2), held).values()
    assert v.fits and {alt for _, alt, _ in v.chosen} == {"neurons/four"}
    assert [d[2] for _, _, d in v.chosen] == [f"neuron-device-{i}" for i in range(12, 16)]


def test_held_tainted_and_tolerated_devices(trn2: Path) -> None:
    slices = load(trn2)
    dev = slices[0]["spec"]["devices"][7]
    dev["taints"] = [{"key": f"{DRIVER}/unhealthy", "value": "UncorrectedErrors", "effect": "NoSchedule"}]
    held = {(DRIVER, "t2", "neuron-device-2"): "team-a/train-0"}
    [v] = verdicts(claim(None), slices, held).values()  # allocationMode All
    assert v.fits is False
    assert v.reasons == ["request neurons: asks for all 16 matching devices, but 1 held by claim team-a/train-0 "
                         "(neuron-device-2); 1 tainted neuron.aws.com/unhealthy=UncorrectedErrors:NoSchedule "
                         "(neuron-device-7)"]
    [v] = verdicts(claim(15), slices, held).values()
    assert v.fits is False and "only 14 of 16 matching devices are free" in v.reasons[0]
    tolerate = [{"key": f"{DRIVER}/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    [v] = verdicts(claim(15, tolerations=tolerate), slices, held).values()
    assert v.fits and "neuron-device-7" in {d[2] for _, _, d in v.chosen}


def test_distinct_attribute_counts_values(trn2: Path) -> None:
    spread = [{"requests": ["neurons"], "distinctAttribute": "resource.aws.com/devicegroup4_id"}]
    [v] = verdicts(claim(4, constraints=spread), load(trn2)).values()
    assert v.fits and [d[2] for _, _, d in v.chosen] == [f"neuron-device-{i}" for i in (0, 4, 8, 12)]
    [v] = verdicts(claim(5, constraints=spread), load(trn2)).values()
    assert v.fits is False and "have 4 distinct values" in v.reasons[-1]


def test_shared_counters_keep_the_node_device_from_a_held_chip(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    path = slices_of(tmp_path, "u0", "trn2u.48xlarge", capsys, ultraserver_id="a", ultraserver_node=0)
    node_claim = claim(1, selectors=(f"device.attributes['{DRIVER}'].resourceType == 'neuron_node'",))
    [v] = verdicts(node_claim, load(path)).values()
    assert v.fits and [d[2] for _, _, d in v.chosen] == ["neuron-node"]
    [v] = verdicts(node_claim, load(path), {(DRIVER, "u0", "neuron-device-3"): "ns/chip"}).values()
    assert v.fits is False
    assert "1 shared counter neuron-chips/chips used up by allocated devices (neuron-node)" in v.reasons[0], v.reasons


def test_unsupported_selector_gives_no_verdict(trn2: Path) -> None:
    [v] = verdicts(claim(1, selectors=("device.driver.quote() == 'neuron.aws.com'",)), load(trn2)).values()
    assert v.fits is None and "quote" in v.reasons[0]


# -- command line -----------------------------------------------------------------------------------------------------
def test_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert efa_cli.main(["explain"]) == 2
    assert "efa-dra-driver explain: error: a target" in capsys.readouterr().err
    assert neuron_cli.main(["explain", "deployment/x"]) == 1
    assert "target 'deployment/x': expected pod/NAME" in capsys.readouterr().err
    missing = tmp_path / "nope.yaml"
    assert neuron_cli.main(["explain", "-f", str(missing)]) == 1
    assert f"{missing}: [Errno 2]" in capsys.readouterr().err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    assert neuron_cli.main(["explain", "pod/x", "--kubeconfig", str(kubeconfig)]) == 1
    assert "neuron-dra-driver explain: error: API server https://127.0.0.1:1: " in capsys.readouterr().err
    assert neuron_cli.main(["explain", "pod/x", "--kubeconfig", str(kubeconfig), "--context", "y"]) == 1
    assert "no usable kubeconfig: Context 'y' not found" in capsys.readouterr().err


@pytest.mark.parametrize("document", [
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"},  # no metadata
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
     "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "neuron.aws.com",
                                                                 "count": "1k"}}]}}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
     "spec": {"devices": {"requests": "all"}}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
     "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "neuron.aws.com"}}]}},
     "status": {"allocation": {"devices": {"results": [{"device": "x"}]}}}},
])
def test_a_malformed_input_file_is_one_line_not_a_traceback(trn2: Path, tmp_path: Path, document: dict[str, Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(document))
    code = neuron_cli.main(["explain", "-f", str(path), "--slices", str(trn2)])
    err = capsys.readouterr().err
    assert code in (0, 1) and "Traceback" not in err, err
    if code == 1:
        assert err.startswith("neuron-dra-driver explain: error: ") and err.count("\n") == 1, err


def test_counts_are_of_the_requests_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_host(tmp_path / "h", "trn2.48xlarge")
    build_host(tmp_path / "p5", "p5.48xlarge")
    slices = []
    for root, node, mains in (("h", "t2", (neuron_cli.main, efa_cli.main)), ("p5", "p5", (efa_cli.main,))):
        for main in mains:
            assert main(["slices", "--host-root", str(tmp_path / root), "--node-name", node]) == 0
            slices += json.loads(capsys.readouterr().out)
    verdict = verdicts(claim(17, selectors=()), slices)
    assert verdict["t2"].reasons == ["request neurons: asks for 17 devices, only 16 of the node's 16 devices of "
                                     "class neuron.aws.com match"]
    assert verdict["p5"].reasons[0].startswith(
        "request neurons: no device of class neuron.aws.com on the node: selector #0 of class neuron.aws.com "
        "`device.driver == \"neuron.aws.com\"` rejects 32 (efa-"), verdict["p5"].reasons


def test_a_pod_asking_an_extended_resource_gets_the_schedulers_claim(trn2: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """DRAExtendedResource: one ExactCount request per container from the class whose extendedResourceName it is;
    two containers' 12 and 5 devices do not fit one node of 16."""
    objects = tmp_path / "pod.yaml"
    extended = CLASS | {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"}
    extended["spec"] = extended["spec"] | {"extendedResourceName": "aws.amazon.com/neuron"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dp"}, "spec": {"containers": [
        {"name": "a", "image": "x", "resources": {"limits": {"aws.amazon.com/neuron": 12}}},
        {"name": "b", "image": "x", "resources": {"limits": {"aws.amazon.com/neuron": 5, "cpu": "1"}}}]}}
    objects.write_text(yaml.safe_dump_all([extended, pod]))
    assert neuron_cli.main(["explain", "-f", str(objects), "--slices", str(trn2), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["requests"] == [
        "claim extended resources (aws.amazon.com/neuron): request container-a-0: 12 of class neuron.aws.com",
        "claim extended resources (aws.amazon.com/neuron): request container-b-1: 5 of class neuron.aws.com"]
    assert result["nodes"]["t2"]["reasons"][-1] == "the requests together ask for 17 devices; 16 distinct free " \
                                                   "devices match them"
    pod["spec"]["containers"][0]["resources"]["limits"]["aws.amazon.com/neuron"] = 11
    objects.write_text(yaml.safe_dump_all([extended, pod]))
    assert neuron_cli.main(["explain", "-f", str(objects), "--slices", str(trn2), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] == ["t2"]


def test_what_explain_does_not_model_is_said(trn2: Path) -> None:
    slices = load(trn2)
    slices[0]["spec"]["devices"][0]["allowMultipleAllocations"] = True
    spec = claim(1)
    spec["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "1Gi"}}
    notes = Explainer([ClaimSpec("c", spec)], {DRIVER: CLASS}, slices, {}).notes()
    assert notes == ["1 device(s) allow multiple allocations (consumable capacity), taken here as held by one claim: "
                     "neuron-device-0", "a request asks for device capacity (consumable capacity): not checked by "
                     "explain"]
