"""Hypothesis strategies from the JSON schemas of the OpenAPI document.

The subset that msgspec generates (objects, arrays, anyOf, enum, numbers with bounds, strings
with lengths and patterns) is small, so it is covered here directly; hypothesis-jsonschema 0.23
does not run with this hypothesis release (it uses an internal API that was removed).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

#: Keep generated collections small: the point is shapes, not volume.
MAX_ITEMS = 6


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "anyOf" in schema:
        return st.one_of([from_schema(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -(2**63) - 1) + 1)
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 2**63) - 1)
        return st.integers(min_value=lo, max_value=hi)
    if kind == "number":
        return st.floats(
            min_value=schema.get("minimum"),
            max_value=schema.get("maximum"),
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "string":
        lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 24), 64)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: lo <= len(s) <= hi
            )
        return st.text(min_size=lo, max_size=hi)
    if kind == "array":
        lo = schema.get("minItems", 0)
        hi = max(lo, min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
        return st.lists(from_schema(schema.get("items", {})), min_size=lo, max_size=hi)
    if kind == "object":
        return _object(schema)
    return JSON


def _object(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    fixed = {k: from_schema(v) for k, v in props.items() if k in required}
    optional = {k: from_schema(v) for k, v in props.items() if k not in required}
    base = st.fixed_dictionaries(fixed, optional=optional)
    extra = schema.get("additionalProperties")
    if not props and isinstance(extra, dict):
        names = from_schema({"type": "string", **schema.get("propertyNames", {})})
        return st.dictionaries(names, from_schema(extra), max_size=MAX_ITEMS)
    return base


def near_misses(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Valid bodies with one top-level field dropped or replaced by arbitrary JSON."""

    @st.composite
    def mutate(draw: st.DrawFn) -> Any:
        body = draw(from_schema(schema))
        if not isinstance(body, dict) or not body:
            return body
        key = draw(st.sampled_from(sorted(body)))
        if draw(st.booleans()):
            del body[key]
        else:
            body[key] = draw(JSON)
        return body

    return mutate()
