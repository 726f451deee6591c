"""A small JSON Schema validator: the subset of draft 2020-12 that
wdiff/cli/schemas/*.json use (type, const, enum, properties, required,
additionalProperties, items, anyOf, minimum, maximum, pattern). Kept here
rather than depending on `jsonschema` for a dozen keywords; it refuses any
keyword it does not know, so a schema cannot silently ask for more."""

from __future__ import annotations

import re

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_ANNOTATIONS = {"$schema", "$id", "title", "description"}
_KNOWN = _ANNOTATIONS | {"type", "const", "enum", "properties", "required", "additionalProperties", "items", "anyOf",
                         "minimum", "maximum", "pattern"}


def errors(schema: dict, value, where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as 'path: what' lines."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"{where}: schema keywords this validator does not know: {sorted(unknown)}")
    out: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [f"{where}: {type(value).__name__} is not {' or '.join(types)}"]
    if "const" in schema and not (value == schema["const"] and type(value) is type(schema["const"])):
        out.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "anyOf" in schema and not any(not errors(s, value, where) for s in schema["anyOf"]):
        out.append(f"{where}: {value!r} matches none of anyOf")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        out.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += errors(schema["items"], item, f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{where}: missing {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += errors(props[key], item, f"{where}.{key}")
            elif extra is False:
                out.append(f"{where}: {key!r} is not documented in the schema")
            elif isinstance(extra, dict):
                out += errors(extra, item, f"{where}.{key}")
    return out
