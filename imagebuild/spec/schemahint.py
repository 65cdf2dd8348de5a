"""What the JSON Schema says about values and sections that a Python check decides.

The checks in values.py, names.py, repopaths.py and the models' validators stay the
rule the CLI applies (with its message and fix); the keywords here let an editor
underline the same mistakes at the same place: a `pattern` for a value with a grammar, and
`if`/`then` for a section whose fields depend on each other. Patterns are written for
both regex dialects a schema meets (ECMA-262 in editors, Python's `re` in jsonschema): no
inline flags, no named groups, explicit ASCII classes.
tests/unit/test_matrix_schema_mutations.py mutates every value of the repository's
matrices and fails where the two disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


class Schema:
    """Annotated marker: JSON Schema keywords added to the type's generated schema."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema.update(self.keywords)
        return schema


def pattern_of(regex: re.Pattern[str]) -> str:
    """A Python check's anchored regex as a schema pattern: its `\\Z` (the very end) is
    `$` there (ECMA-262 has no `\\Z`)."""
    return regex.pattern.replace("\\Z", "$")


def anycase(pattern: str) -> str:
    """A pattern of lowercase letters matching them in any case (JSON Schema patterns take
    no flags): a letter outside a class becomes [xX], a class's a-z range gains A-Z."""
    out, in_class, escaped = [], False, False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif ch == "[":
            in_class = True
            out.append(ch)
        elif ch == "]":
            in_class = False
            out.append(ch)
        elif ch.isascii() and ch.islower() and not in_class:
            out.append(f"[{ch}{ch.upper()}]")
        else:
            out.append(ch)
    return "".join(out).replace("[a-z", "[a-zA-Z")


def given(field: str) -> dict[str, Any]:
    """The field is written with a value (YAML `null` counts as left out, as the models
    read it). Said of the section, not of the value, so a refusal points at the section
    as the CLI's does."""
    return {"required": [field],
            "not": {"properties": {field: {"type": "null"}}, "required": [field]}}


def absent(field: str) -> dict[str, Any]:
    return {"not": given(field)}


def equals(field: str, value: Any) -> dict[str, Any]:
    return {"properties": {field: {"const": value}}, "required": [field]}


def one_of(*sections: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": list(sections)}


def rules(*sections: dict[str, Any]) -> dict[str, Any]:
    """A model's json_schema_extra: every section must hold (a model validator's rules)."""
    return {"allOf": list(sections)}


def none_of(sections: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"not": {"anyOf": list(sections)}}
