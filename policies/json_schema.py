"""JSON Schema export of the policy format, with each action's and detector's own parameters."""
from __future__ import annotations

from typing import Any, Mapping

from actions.base import Action
from detectors.base import Detector
from policies.schema import Policy


def policy_json_schema(actions: Mapping[str, type[Action]],
                       detectors: Mapping[str, type[Detector]]) -> dict[str, Any]:
    """A JSON Schema (2020-12) for one policy document, for editors and CI linting."""
    schema = Policy.model_json_schema(by_alias=True)
    defs = schema.setdefault("$defs", {})
    action_variants = []
    for kind in sorted(actions):
        params = actions[kind].Params.model_json_schema(by_alias=True)
        defs.update(params.pop("$defs", {}))
        params.setdefault("properties", {})["type"] = {"const": kind}
        params["required"] = sorted(set(params.get("required", [])) | {"type"})
        params["additionalProperties"] = False
        params["title"] = kind
        action_variants.append(params)
    schema["properties"]["actions"]["items"] = {"oneOf": action_variants}
    detector_variants = []
    for kind in sorted(detectors):
        params = detectors[kind].Params.model_json_schema(by_alias=True)
        defs.update(params.pop("$defs", {}))
        detector_variants.append({"title": kind, "if": {"properties": {"type": {"const": kind}}},
                                  "then": {"properties": {"params": params}}})
    if "DetectorTrigger" in defs and detector_variants:
        defs["DetectorTrigger"]["properties"]["type"] = {"enum": sorted(detectors)}
        defs["DetectorTrigger"]["allOf"] = detector_variants
    # The loader's `needs_verify`: a policy that may act (not dryRun) and whose live (not shadow)
    # triggers are all alerts, at least one, needs a verify block.
    shadow = {"properties": {"shadow": {"const": True}}, "required": ["shadow"]}
    schema["if"] = {"required": ["triggers"], "properties": {
        "triggers": {"contains": {"not": shadow}, "items": {"anyOf": [{"required": ["alert"]}, shadow]}},
        "guards": {"not": {"properties": {"dryRun": {"const": True}}, "required": ["dryRun"]}}}}
    schema["then"] = {"required": ["verify"]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
