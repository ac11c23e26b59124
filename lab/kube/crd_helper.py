"""The CRD validation helper from fixtures/schemas/README.md (BEGIN helper .. END helper), verbatim.

One copy for every test that validates objects against the real CRD schemas.
"""
import json
import re

import jsonschema
import yaml

_SCHEMA_MAP_KEYS = ("properties", "patternProperties")  # name -> schema
_SCHEMA_KEYS = ("additionalProperties", "items", "not")   # schema (or bool)
_SCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf")           # [schema]
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
_DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA_SCHEMA = {
    "type": "object",
    "anyOf": [{"required": ["name"]}, {"required": ["generateName"]}],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS1123_SUBDOMAIN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}


def k8s_schema_to_jsonschema(node, strict=False):
    """Return a JSON Schema (draft 4) copy of one CRD openAPIV3Schema node.

    Args:
        node: a schema node from spec.versions[].schema.openAPIV3Schema.
        strict: reject unknown fields (like kubectl --validate=strict).
    Returns:
        a new dict; `node` is not modified.
    """
    if not isinstance(node, dict):
        return node
    out = {}
    for key, val in node.items():
        if key in _SCHEMA_MAP_KEYS:
            out[key] = {n: k8s_schema_to_jsonschema(s, strict) for n, s in val.items()}
        elif key in _SCHEMA_KEYS:
            if isinstance(val, list):  # tuple form of items
                out[key] = [k8s_schema_to_jsonschema(s, strict) for s in val]
            else:
                out[key] = k8s_schema_to_jsonschema(val, strict)
        elif key in _SCHEMA_LIST_KEYS:
            out[key] = [k8s_schema_to_jsonschema(s, strict) for s in val]
        elif key == "x-kubernetes-validations":  # CEL: cannot be evaluated here
            continue
        elif key == "pattern" and val.startswith("^(?"):  # RE2 allows ^(?i)...
            out[key] = re.sub(r"^\^(\(\?[a-zA-Z]+\))", r"\1^", val)
        else:  # type, required, enum, default, minimum, ... copied as they are
            out[key] = val
    if out.get("x-kubernetes-int-or-string") and out.get("anyOf") != _INT_OR_STRING:
        out.setdefault("allOf", []).append({"anyOf": _INT_OR_STRING})
    if (strict and out.get("type") == "object" and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False):
        return {"anyOf": [{"type": "null"}, out]}
    return out


def _list_type(validator, list_type, instance, schema):
    """x-kubernetes-list-type: 'set' items are unique, 'map' items have unique keys."""
    if not validator.is_type(instance, "array"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen = set()
    for item in instance:
        if list_type == "set":
            ident = json.dumps(item, sort_keys=True)
        elif list_type == "map" and isinstance(item, dict):
            ident = json.dumps([item.get(k) for k in keys])
        else:  # 'atomic' or a non-object item in a map list
            continue
        if ident in seen:
            yield jsonschema.ValidationError(
                f"duplicate {'item' if list_type == 'set' else 'key ' + str(keys)}: {ident}"
                f" (x-kubernetes-list-type={list_type})")
        seen.add(ident)


K8sValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})


def load_crd_validators(path, strict=False):
    """Build a validator for every served version of every CRD in a YAML file.

    Returns:
        {(apiVersion, kind): K8sValidator}, e.g. ("networking.istio.io/v1", "VirtualService").
    """
    validators = {}
    with open(path, encoding="utf-8") as fh:
        for crd in yaml.safe_load_all(fh):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served"):
                    continue
                api_version = f"{group}/{version['name']}"
                schema = k8s_schema_to_jsonschema(
                    version["schema"]["openAPIV3Schema"], strict)
                schema.setdefault("properties", {}).update(
                    apiVersion={"enum": [api_version]},
                    kind={"enum": [kind]},
                    metadata=METADATA_SCHEMA)
                schema["required"] = sorted(
                    set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
                K8sValidator.check_schema(schema)
                validators[(api_version, kind)] = K8sValidator(schema)
    return validators


def validation_errors(validators, obj):
    """Return ["path: message", ...] for one object; an empty list means valid."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in validators:
        return [f"<root>: no served CRD version for apiVersion={key[0]!r} kind={key[1]!r}"]
    errors = sorted(validators[key].iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]
