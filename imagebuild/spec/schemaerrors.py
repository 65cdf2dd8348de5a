"""A matrix.yaml that does not fit the schema, said in our words at file:line:column.

pydantic reports each mistake in its own vocabulary ("Extra inputs are not permitted",
"Field required") and once per place the value reaches: a key misspelt in a profile that
others `extend` came back once per extending profile, all at the same line. Here one
mistake is one line (the places it reaches are named on it), an unknown key gets the
nearest key of its section ("did you mean `methods`?") and a misspelt required key is
one error, not an unknown key plus a missing one.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from imagebuild.errors import UserError, validation_text
from imagebuild.spec.renames import renamed
from imagebuild.spec.values import BadValue
from imagebuild.spec.yamlpos import TAG, Located, explain, quote_fix, shorten

MAX_ALSO = 5  # further mistakes listed under the first


def _bad_value(err: Any) -> BadValue | None:
    error = (err.get("ctx") or {}).get("error")
    return error if isinstance(error, BadValue) else None


def _string_expected(err: Any) -> bool:
    """The schema wanted a string here (a Literal of strings counts)."""
    if err["type"] == "literal_error":
        return "'" in str((err.get("ctx") or {}).get("expected", ""))
    return err["type"] in ("string_type", "string_pattern_mismatch", "enum")


def _surprise(located: Located, err: Any) -> Any:
    """The plain scalar YAML read as a non-string where this error sits, if any."""
    if err["type"] in ("missing", "extra_forbidden"):
        return None
    loc = tuple(err["loc"])
    for cut in range(len(loc), 0, -1):  # union errors add a member name to the path
        found = located.surprise(loc[:cut])
        if found is not None:
            return found
    return None


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
        else None


def _step(annotation: Any, part: str | int) -> Any:
    """The annotation of `part` inside a value of `annotation` (None: not known)."""
    model = _model(annotation)
    if model is not None:
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _step(args[0], part)
    if origin is dict:
        return args[1]
    if origin in (list, tuple) and isinstance(part, int):
        return args[0]
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if getattr(member, "__name__", None) == part:  # pydantic names union members
                return member
            found = _step(member, part)
            if found is not None:
                return found
    return None


def known_keys(root: type[BaseModel], section: tuple[str | int, ...]) -> list[str]:
    """The keys the section at `section` takes (its model's fields), [] when unknown."""
    annotation: Any = root
    for part in section:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    for candidate in (annotation, *typing.get_args(annotation)):
        model = _model(candidate)
        if model is not None:
            return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _nearest(err: Any, root: type[BaseModel]) -> str | None:
    """The key an unknown key was most likely meant to be."""
    loc = tuple(err["loc"])
    near = difflib.get_close_matches(str(loc[-1]), known_keys(root, loc[:-1]), n=1, cutoff=0.6)
    return near[0] if near else None


def _fix_for(err: Any, located: Located, root: type[BaseModel]) -> str:
    kind = err["type"]
    rename = renamed(tuple(err["loc"])) if kind == "extra_forbidden" else None
    if rename is not None:
        return (f"write `{rename.new}` instead (`python build.py migrate` rewrites the "
                "file, comments kept)")
    bad = _bad_value(err)
    if bad is not None:
        return bad.fix
    surprise = _surprise(located, err)
    if surprise is not None and _string_expected(err):
        return quote_fix(surprise)
    if kind == "extra_forbidden":
        near = _nearest(err, root)
        keys = known_keys(root, tuple(err["loc"])[:-1])
        return (f"write `{near}`" if near else "remove the key or correct its spelling") + (
            f" (this section's keys: {', '.join(keys)})" if keys and len(keys) <= 25 else
            " (docs/matrix-reference.md; `python build.py schema` prints the JSON Schema)")
    if kind == "missing":
        return "add the field"
    if kind in ("literal_error", "enum"):
        return "use one of the allowed values"
    if kind == "string_pattern_mismatch":
        return "use lowercase letters, digits, '.', '_' or '-' (start with a letter or digit)"
    if kind.endswith("_type") and surprise is not None and surprise.tag == TAG + "bool":
        return "write the value itself (YAML turned the word into a boolean)"
    if kind == "bool_type":
        return "write true or false, unquoted"
    if kind in ("int_type", "float_type", "int_parsing", "float_parsing") and \
            isinstance(err.get("input"), str):
        try:
            float(err["input"])
        except ValueError:
            return "write a number" + (", e.g. 0.3" if "float" in kind else ", e.g. 8")
        return "write the number unquoted"
    return "correct the value"


def _shown_path(err: Any, located: Located) -> str:
    """The error's path as written in the file (pydantic adds union member names)."""
    loc = tuple(err["loc"])
    cut = next((n for n in range(len(loc), 0, -1) if loc[:n] in located.marks), len(loc))
    if err["type"] in ("missing", "extra_forbidden"):
        cut = len(loc)
    return ".".join(str(p) for p in loc[:cut]) or "(top level)"


def _describe(err: Any, located: Located, root: type[BaseModel]) -> str:
    loc = _shown_path(err, located)
    kind = err["type"]
    rename = renamed(tuple(err["loc"])) if kind == "extra_forbidden" else None
    if rename is not None:
        return f"{loc}: {rename.hint}"
    bad = _bad_value(err)
    if bad is not None:
        return f"{loc}: {bad}"
    if kind == "extra_forbidden":
        near = _nearest(err, root)
        return f"{loc}: unknown key" + (f"; did you mean `{near}`?" if near else "")
    found = err.get("input")
    surprise = _surprise(located, err)
    if surprise is not None:
        return f"{loc}: {validation_text(err)}, but {explain(surprise)}"
    shown = ("" if kind == "missing" or isinstance(found, dict)
             else f"; found {shorten(found)}")
    return f"{loc}: {validation_text(err)}{shown}"


def _one_per_mistake(errors: list[Any], located: Located,
                     root: type[BaseModel]) -> list[tuple[Any, list[str]]]:
    """Each mistake once, with the other places it reached (a key a profile's `extends`
    children inherit sits at one line of the file), the misspelling first; a required
    key that an unknown key misspells is no second mistake."""
    errors = sorted(errors, key=lambda e: (e["type"] != "extra_forbidden",
                                           e["type"] == "missing"))
    meant = {(*tuple(e["loc"])[:-1], near) for e in errors if e["type"] == "extra_forbidden"
             and (near := _nearest(e, root)) is not None}
    groups: dict[tuple, tuple[Any, list[str]]] = {}
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in meant:
            continue
        key = (located.where(loc), e["type"], loc[-1] if loc else None)
        if key in groups:
            groups[key][1].append(_shown_path(e, located))
        else:
            groups[key] = (e, [])
    return list(groups.values())


def invalid(exc: ValidationError, located: Located, root: type[BaseModel]) -> UserError:
    """The error `check` (and every command) shows for a matrix `root` refused."""
    mistakes = _one_per_mistake(exc.errors(), located, root)

    def said(err: Any, others: list[str]) -> str:
        text = _describe(err, located, root)
        inherited = [o.rsplit(".", 1)[0] for o in others]
        return text + (f" (inherited by {', '.join(inherited)})" if others else "")

    first, others = mistakes[0]
    lines = [f"{located.where(tuple(e['loc']))}: {said(e, o)}" for e, o in
             mistakes[1:1 + MAX_ALSO]]
    if len(mistakes) > 1 + MAX_ALSO:
        lines.append(f"... and {len(mistakes) - 1 - MAX_ALSO} more")
    message = said(first, others) + ("\n" + "\n".join(["also:", *lines]) if lines else "")
    return UserError(message, fix=_fix_for(first, located, root),
                     where=located.where(tuple(first["loc"])))
