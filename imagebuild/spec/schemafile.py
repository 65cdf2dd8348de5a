"""matrix.yaml as JSON Schema (draft 2020-12), generated from the pydantic models in
config.py, so an editor completes and underlines what `build.py check` refuses.

The package ships the generated file (SCHEMA_FILE) and the repository keeps a copy at
docs/matrix.schema.json for the `# yaml-language-server: $schema=...` line of its
matrices; tests/unit/test_matrix_schema.py fails when either drifts from the models.
pydantic's output is adjusted where the file says more than the models alone: a profile
that `extends` another inherits its description; name-keyed maps refuse other keys; the
removed `torch_index` is refused as the loader refuses it.
"""

from __future__ import annotations

import json
from typing import Any

from imagebuild import PACKAGE_DIR
from imagebuild.spec.argschema import args_schema
from imagebuild.spec.config import Matrix
from imagebuild.spec.renames import RENAMES

SCHEMA_FILE = PACKAGE_DIR / "spec" / "matrix.schema.json"
REPO_COPY = "docs/matrix.schema.json"  # in a checkout, for its matrices' modelines
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# the line every matrix we write starts with (the path is relative to the matrix)
MODELINE = "# yaml-language-server: $schema={path}"


def _name_keyed(node: Any) -> None:
    """pydantic writes a map with constrained keys as patternProperties, which lets a key
    that misses the pattern through; the loader refuses it, so the schema says so too."""
    if isinstance(node, dict):
        pattern = node.get("patternProperties")
        if isinstance(pattern, dict) and len(pattern) == 1:
            (key, value), = pattern.items()
            del node["patternProperties"]
            node["additionalProperties"] = value
            node["propertyNames"] = {**node.get("propertyNames", {}), "pattern": key}
        for value in node.values():
            _name_keyed(value)
    elif isinstance(node, list):
        for value in node:
            _name_keyed(value)


def _node_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The object schema a mapping at `path` ("*": any name) is validated by."""
    node = schema
    for part in path:
        ref = node.get("$ref")
        if ref:
            node = schema["$defs"][ref.rsplit("/", 1)[-1]]
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
        options = [o for o in node.get("anyOf", []) if o.get("type") != "null"]
        node = options[0] if len(options) == 1 else node
    ref = node.get("$ref")
    return schema["$defs"][ref.rsplit("/", 1)[-1]] if ref else node


def _renamed_keys(schema: dict[str, Any]) -> None:
    """An old key is refused with its replacement in view (editors show the text)."""
    for rename in RENAMES:
        node = _node_at(schema, rename.path[:-1])
        node["properties"][rename.path[-1]] = {"description": rename.hint, "deprecated": True,
                                               "not": {}}


def build_schema() -> dict[str, Any]:
    schema = Matrix.model_json_schema(by_alias=True, mode="validation")
    _name_keyed(schema)
    defs = schema["$defs"]
    # a child profile inherits its parent's description (spec/profiles.py)
    profile = defs["Profile"]
    profile["required"] = [r for r in profile.get("required", []) if r != "description"]
    if not profile["required"]:
        del profile["required"]
    profile["if"] = {"not": {"required": ["extends"]}}
    profile["then"] = {"required": ["description"]}
    # `extends: null` is refused (spec/profiles.py): leaving it out is how to say none
    extends = profile["properties"]["extends"]
    profile["properties"]["extends"] = {
        **next(o for o in extends.pop("anyOf") if o.get("type") != "null"),
        **{k: v for k, v in extends.items() if k != "default"}}
    # args: the serve flags of every vLLM version whose facts are shipped (argschema.py)
    profile["properties"]["args"] = args_schema()
    old = defs["Target"]["properties"]["torch_index"]
    defs["Target"]["properties"]["torch_index"] = {
        "description": old.get("description", ""), "deprecated": True, "type": "null"}
    _renamed_keys(schema)
    return {"$schema": DIALECT, "title": "imagebuild matrix.yaml",
            "description": "One matrix.yaml: targets, engines, models, drafters, profiles "
                           "and image families (docs/matrix-reference.md).",
            **{k: v for k, v in schema.items() if k != "title"}}


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def shipped() -> str:
    """The schema as the package ships it (the generated file)."""
    return SCHEMA_FILE.read_text(encoding="utf-8")
