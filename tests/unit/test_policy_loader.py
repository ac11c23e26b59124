"""Policy loading: strict schema, errors that name file/policy/field, JSON Schema export."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from policies.json_schema import policy_json_schema
from policies.loader import PolicyLoadError, load_policies, load_policies_text

GOOD = """
name: ranker-tail
target:
  model: ranker
  triton: {endpoints: ["http://127.0.0.1:8000"]}
triggers:
  - alert: {name: TritonTailLatencyHigh, matchers: {severity: page}}
actions:
  - type: triton.rollback
    to: previous
guards: {cooldown: 10m, dryRun: false}
verify: {query: 'max(nv_inference_request_summary_us{model="$model", quantile="0.999"})', below: 500000}
"""


def _load(text: str):
    return load_policies_text(text, "p.yaml", action_registry(), detector_registry())


def test_valid_policy_binds_action_params_and_target():
    """A valid policy loads with typed action params, durations in seconds and a core Target."""
    ps = _load(GOOD)
    (p,) = ps.policies
    assert p.name == "ranker-tail"
    assert p.spec.guards.cooldown == 600.0
    assert p.target.model == "ranker" and p.target.triton_endpoints == ("http://127.0.0.1:8000",)
    assert p.actions[0].kind == "triton.rollback" and p.actions[0].params.to == "previous"


def test_unknown_action_type_is_an_error_naming_the_field():
    """An unknown action type is rejected (never a fallback), naming file, policy and field."""
    with pytest.raises(PolicyLoadError) as err:
        _load(GOOD.replace("triton.rollback", "triton.rolback"))
    (e,) = err.value.errors
    assert e.file == "p.yaml" and e.policy == "ranker-tail" and e.field == "actions[0].type"
    assert "unknown action type 'triton.rolback'" in e.message


def test_typo_in_action_param_is_rejected():
    """Action params are strict: a misspelt key fails at load time with its path."""
    with pytest.raises(PolicyLoadError) as err:
        _load(GOOD.replace("to: previous", "too: previous"))
    assert any(e.field == "actions[0].too" and "unknown field" in e.message for e in err.value.errors)


def test_bad_duration_and_missing_trigger_are_reported_together():
    """Every error of a document is reported at once, each with its field."""
    text = GOOD.replace("cooldown: 10m", "cooldown: ten minutes").replace(
        "  - alert: {name: TritonTailLatencyHigh, matchers: {severity: page}}\n", "  - {}\n")
    with pytest.raises(PolicyLoadError) as err:
        _load(text)
    fields = {e.field for e in err.value.errors}
    assert "guards.cooldown" in fields
    assert "triggers[0]" in fields


def test_triton_action_without_triton_target_fails_cross_check():
    """The cross-reference pass: a Triton action needs target.triton."""
    text = GOOD.replace('  triton: {endpoints: ["http://127.0.0.1:8000"]}\n', "")
    with pytest.raises(PolicyLoadError) as err:
        _load(text)
    assert any("needs target.triton" in e.message for e in err.value.errors)


@pytest.mark.parametrize("endpoint", ["http://triton.serving.svc:8000", "http://triton.serving.svc.cluster.local:8000"])
def test_a_services_load_balanced_name_is_no_triton_endpoint(endpoint: str):
    """A Service's cluster name sends a load and the verify after it to different pods: refused, naming
    what to write instead; a pod's own name under a headless Service loads."""
    with pytest.raises(PolicyLoadError) as err:
        _load(GOOD.replace("http://127.0.0.1:8000", endpoint))
    assert any("is a Service's load-balanced name" in e.message and "`service:`" in e.message
               for e in err.value.errors), err.value.errors
    (p,) = _load(GOOD.replace("http://127.0.0.1:8000", "http://triton-0.triton.serving.svc.cluster.local:8000")).policies
    assert p.target.triton_endpoints == ("http://triton-0.triton.serving.svc.cluster.local:8000",)


def test_directory_with_duplicate_names_and_hidden_files(tmp_path: Path):
    """A directory loads every YAML file once (hidden ..data entries skipped); duplicate names fail."""
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / ".hidden.yaml").write_text("not: [valid")
    (tmp_path / "notes.txt").write_text("ignored")
    assert [p.name for p in load_policies(tmp_path, action_registry(), detector_registry()).policies] == [
        "ranker-tail"]
    (tmp_path / "b.yml").write_text(GOOD)
    with pytest.raises(PolicyLoadError) as err:
        load_policies(tmp_path, action_registry(), detector_registry())
    assert any("duplicate policy name" in e.message for e in err.value.errors)


def test_multi_document_file_and_yaml_syntax_error(tmp_path: Path):
    """Several policies per file load; broken YAML gives a clear error, not a traceback."""
    f = tmp_path / "many.yaml"
    f.write_text(GOOD + "---\n" + GOOD.replace("ranker-tail", "ranker-two"))
    assert len(load_policies(f, action_registry(), detector_registry()).policies) == 2
    f.write_text("name: [unclosed")
    with pytest.raises(PolicyLoadError) as err:
        load_policies(f, action_registry(), detector_registry())
    assert "invalid YAML" in err.value.errors[0].message


def test_validate_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`tailguard validate` exits 0 on good policies and 1 with readable errors on bad ones."""
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert main(["validate", str(good)]) == 0
    assert "ok: ranker-tail" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("model: ranker", "model: ''"))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml: policy 'ranker-tail': target.model" in err


ALERT_ONLY = GOOD.replace(GOOD[GOOD.index("verify:"):], "")  # alert triggers only, no verify block
SHADOW = "  - {alert: {name: TritonTailLatencyHigh}, shadow: true}\n"
DETECTOR = ("  - {detector: {type: tail_anomaly, query: 'max(p999{model=\"$model\"})', "
            "params: {min_absolute_increase: 100000}}}\n")


def _triggers(*lines: str) -> str:
    """ALERT_ONLY with its triggers replaced by `lines`."""
    start, end = ALERT_ONLY.index("triggers:\n") + len("triggers:\n"), ALERT_ONLY.index("actions:")
    return ALERT_ONLY[:start] + "".join(lines) + ALERT_ONLY[end:]


def test_alert_only_policy_without_verify_is_refused_naming_policy_field_and_fix():
    """Acting on alerts only, nothing would check that acting helped: one readable error line naming
    the policy, the field `verify` and the fix, with an example that itself loads."""
    with pytest.raises(PolicyLoadError) as err:
        _load(ALERT_ONLY)
    (e,) = err.value.errors
    assert (e.file, e.policy, e.field) == ("p.yaml", "ranker-tail", "verify")
    line = str(e)
    assert line.isprintable() and "\n" not in line
    assert line.startswith("p.yaml: policy 'ranker-tail': verify: required: this policy acts on alerts only")
    assert "add a verify block, e.g. verify: {query: " in line and "(README.md" in line
    example = line[line.index("e.g. ") + len("e.g. "):line.index(" (README.md")]
    (p,) = _load(ALERT_ONLY + example + "\n").policies
    assert p.spec.verify is not None and p.spec.verify.below == 500000 and p.spec.verify.within == 180


@pytest.mark.parametrize("triggers, guards, refused", [
    ((SHADOW,), "", False),  # every trigger shadow: decided and journaled, never applied
    ((GOOD.split("triggers:\n")[1].split("actions:")[0], SHADOW), "", True),  # a live alert acts
    ((GOOD.split("triggers:\n")[1].split("actions:")[0],), "dryRun: true", False),  # planned, never applied
    ((SHADOW, DETECTOR), "", False),  # the live detector's signals check its own line
    ((DETECTOR.replace("}}}", "}}, shadow: true}"), GOOD.split("triggers:\n")[1].split("actions:")[0]), "",
     True),  # the detector only shadows: the live signals are alerts
])
def test_verify_requirement_follows_what_can_act(triggers: tuple[str, ...], guards: str, refused: bool):
    """Required when the triggers that can act (not shadow) are all alerts and the policy is not a
    dry run; a policy that never applies anything reaches no recovery check and is exempt."""
    text = _triggers(*triggers)
    if guards:
        text = text.replace("dryRun: false", guards)
    if refused:
        with pytest.raises(PolicyLoadError) as err:
            _load(text)
        assert [e.field for e in err.value.errors] == ["verify"]
    else:
        assert len(_load(text).policies) == 1
    schema = policy_json_schema(action_registry(), detector_registry())
    if refused:  # the exported JSON Schema says the same
        with pytest.raises(jsonschema.ValidationError, match="'verify' is a required property"):
            jsonschema.validate(yaml.safe_load(text), schema)
    else:
        jsonschema.validate(yaml.safe_load(text), schema)


def test_exported_json_schema_accepts_good_and_rejects_bad_policies():
    """The JSON Schema export validates the same documents the loader accepts."""
    schema = policy_json_schema(action_registry(), detector_registry())
    doc = yaml.safe_load(GOOD)
    jsonschema.validate(doc, schema)
    doc["actions"][0]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
    assert json.dumps(schema)  # serialisable


TAIL_EXCESS = ("  - {detector: {type: tail_excess, query: 'lat{model=\"$model\"}', "
               "companionQuery: 'req{model=\"$model\"}', params: PARAMS}}\n")


@pytest.mark.parametrize("params, names", [
    ("{input: values, values: {direction: both}}", "`input: values` moved to its own detector: use `type: value_cusum` "
                                                   "with the `values:` parameters at the top level"),
    ("{input: counters, line: 500000}", "takes counters only (delete the `input:` line); one value series is "
                                        "`type: value_cusum`"),
])
def test_tail_excess_with_the_old_input_key_fails_in_one_line_naming_value_cusum(params: str, names: str):
    """The value path moved to `value_cusum`: a policy written for it fails to load with one error line
    naming the new type; the same policy as `type: value_cusum` loads, and the schema knows both."""
    text = _triggers(SHADOW, TAIL_EXCESS.replace("PARAMS", params))
    with pytest.raises(PolicyLoadError) as err:
        _load(text)
    (e,) = err.value.errors
    assert e.field == "triggers[1].detector.params" and "\n" not in str(e)
    assert e.message.startswith("tail_excess: `input") and names in e.message
    moved = _triggers(SHADOW, "  - {detector: {type: value_cusum, query: 'p999{model=\"$model\"}', "
                              "params: {direction: both}}}\n")
    (p,) = _load(moved).policies
    assert p.detectors[0].params.model_dump()["direction"] == "both"
    schema = policy_json_schema(action_registry(), detector_registry())
    assert "value_cusum" in schema["$defs"]["DetectorTrigger"]["properties"]["type"]["enum"]
    jsonschema.validate(yaml.safe_load(moved), schema)
    assert (_load(_triggers(SHADOW, TAIL_EXCESS.replace("PARAMS", "{line: 500000}"))).policies[0]
            .detectors[0].params.model_dump()["line"] == 500000)
