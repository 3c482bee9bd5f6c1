"""The json_schema case's objects: built-in JSON Schemas of varied shapes, the prompts that ask for them, a
--schemas file read and checked, and a reply validated against its schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadFlagError

# (subject, schema): varied shapes, every string and array bounded so that a reply closes within --max-tokens
SCHEMAS: tuple[tuple[str, dict], ...] = (
    ("person", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email", "maxLength": 40},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish"]},
                      "maxItems": 3}},
        "required": ["name", "age", "email", "languages"], "additionalProperties": False}),
    ("postal address", {"type": "object", "properties": {
        "street": {"type": "string", "maxLength": 32}, "city": {"type": "string", "maxLength": 24},
        "postcode": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"enum": ["France", "Germany", "Italy", "Spain", "United Kingdom"]}},
        "required": ["street", "city", "postcode", "country"], "additionalProperties": False}),
    ("product", {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "name": {"type": "string", "maxLength": 30},
        "price": {"type": "integer", "minimum": 1, "maximum": 9999},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "in_stock": {"type": "boolean"}},
        "required": ["sku", "name", "price", "tags", "in_stock"], "additionalProperties": False}),
    ("meeting", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 30},
        "date": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
        "attendees": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20}, "role": {"enum": ["host", "speaker", "guest"]}},
            "required": ["name", "role"], "additionalProperties": False}}},
        "required": ["title", "date", "attendees"], "additionalProperties": False}),
    ("order", {"type": "object", "properties": {
        "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                                      "email": {"type": "string", "format": "email",
                                                                "maxLength": 40}},
                     "required": ["name", "email"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["sku", "quantity"], "additionalProperties": False}},
        "status": {"enum": ["pending", "paid", "shipped", "delivered"]}},
        "required": ["order_id", "customer", "items", "status"], "additionalProperties": False}),
    ("book", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "author": {"type": "string", "maxLength": 30},
        "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
        "genres": {"type": "array", "items": {"enum": ["fiction", "history", "science", "poetry", "travel"]},
                   "minItems": 1, "maxItems": 2},
        "isbn": {"type": "string", "pattern": "^97[89]-[0-9]{10}$"}},
        "required": ["title", "author", "year", "genres", "isbn"], "additionalProperties": False}),
    ("weather report", {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "temperature_c": {"type": "integer", "minimum": -60, "maximum": 60},
        "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "fog"]},
        "wind": {"type": "object", "properties": {
            "speed_kmh": {"type": "integer", "minimum": 0, "maximum": 300},
            "direction": {"enum": ["N", "NE", "E", "SE", "S", "SW", "W", "NW"]}},
            "required": ["speed_kmh", "direction"], "additionalProperties": False}},
        "required": ["city", "temperature_c", "conditions", "wind"], "additionalProperties": False}),
    ("recipe", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
        "ingredients": {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "object", "properties": {
            "item": {"type": "string", "maxLength": 20}, "grams": {"type": "integer", "minimum": 1, "maximum": 5000}},
            "required": ["item", "grams"], "additionalProperties": False}},
        "vegetarian": {"type": "boolean"}},
        "required": ["name", "servings", "ingredients", "vegetarian"], "additionalProperties": False}),
    ("support ticket", {"type": "object", "properties": {
        "priority": {"enum": ["low", "normal", "high", "urgent"]},
        "category": {"enum": ["billing", "bug", "account", "feature request"]},
        "summary": {"type": "string", "maxLength": 60}, "reproducible": {"type": ["boolean", "null"]}},
        "required": ["priority", "category", "summary", "reproducible"], "additionalProperties": False}),
    ("service configuration", {"type": "object", "properties": {
        "service": {"type": "string", "pattern": "^[a-z][a-z0-9-]{2,20}$"},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 16},
        "ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "minItems": 1,
                  "maxItems": 3},
        "env": {"type": "object", "properties": {"LOG_LEVEL": {"enum": ["debug", "info", "warning", "error"]},
                                                 "REGION": {"type": "string", "pattern": "^[a-z]{2}-[a-z]+-[1-9]$"}},
                "required": ["LOG_LEVEL", "REGION"], "additionalProperties": False},
        "debug": {"type": "boolean"}},
        "required": ["service", "replicas", "ports", "env", "debug"], "additionalProperties": False}),
)
PROMPTS = (
    "Describe a {subject} as a JSON object.",
    "Give one example of a {subject} in JSON.",
    "Write the JSON record of a {subject} for a test database.",
    "Invent a realistic {subject}. Answer with JSON only.",
    "Return a {subject} as JSON.",
)


@dataclass(frozen=True)
class Obj:
    index: int
    subject: str
    schema: dict
    prompt: str  # the user turn: the request and the schema it follows


def objects(schemas=SCHEMAS, n: int | None = None) -> list[Obj]:
    """Object k: schema k mod len(schemas) with prompt k // len(schemas), so a few objects span several schemas."""
    n = len(schemas) * len(PROMPTS) if n is None else n
    out = []
    for k in range(n):
        subject, schema = schemas[k % len(schemas)]
        ask = PROMPTS[(k // len(schemas)) % len(PROMPTS)].format(subject=subject)
        out.append(Obj(k, subject, schema, f"{ask} It must follow this JSON Schema:\n{json.dumps(schema)}"))
    return out


def read_schemas(path: str) -> tuple[tuple[str, dict], ...]:
    """`--schemas FILE`: a JSON list of {"subject": ..., "schema": {...}}, each schema checked by jsonschema."""
    import jsonschema

    where = f"--schemas {path}"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadFlagError(f"{where}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, list) or not data:
        raise BadFlagError(f"{where}: expected a non-empty JSON list of {{\"subject\", \"schema\"}} objects")
    out = []
    for i, d in enumerate(data):
        if not isinstance(d, dict) or not isinstance(d.get("subject"), str) or not isinstance(d.get("schema"), dict):
            raise BadFlagError(f"{where}: item {i} is not an object with a string 'subject' and an object 'schema'")
        try:
            jsonschema.validators.validator_for(d["schema"]).check_schema(d["schema"])
        except jsonschema.SchemaError as e:
            raise BadFlagError(f"{where}: item {i} ({d['subject']}): not a valid JSON Schema: "
                               f"{str(e.message).splitlines()[0][:200]}") from None
        out.append((d["subject"], d["schema"]))
    return tuple(out)


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
