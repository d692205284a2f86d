"""GitHub's OpenAPI description as the stand-in's referee: every request the bot sends (path
parameters, query, JSON body), every answer the stand-in gives (status documented for the
operation, body schema) and every webhook body it sends is checked against the vendored slice
`openapi/api.github.com.subset.json`.

The description is OpenAPI 3.0; jsonschema speaks JSON Schema 2020-12. On load, `nullable` becomes
a "null" type, `$ref`s become absolute so any sub-schema validates on its own, and the few places
where GitHub's text disagrees with GitHub's behaviour are relaxed (RELAXATIONS, each with its reason).
"""

from __future__ import annotations

import datetime
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_FILE = Path(__file__).parent / "openapi" / "api.github.com.subset.json"
BASE = "urn:github-openapi"
# Answers GitHub documents once for the whole API (conditional requests, authentication, rate
# limits, absent or hidden resources, "Validation Failed", outages) rather than under each
# operation; their bodies are still checked against basic-error.
GLOBAL_STATUSES = {304, 401, 403, 404, 422, 429, 500, 502, 503}

RELAXATIONS = [
    "oneOf is read as anyOf: GitHub's alternatives overlap (GET /user answers private-user or "
    "public-user, and every private-user is also a valid public-user), so exactly-one never holds.",
    "POST /repos/{owner}/{repo}/issues/{issue_number}/labels also takes a bare array of label names: "
    "the schema lists only {labels: [...]}, but its own text says 'You can also pass an array of labels "
    "directly', GitHub accepts it, and PyGithub's add_to_labels sends exactly that.",
    "422 is accepted for every operation (checked as basic-error): GitHub answers 'Validation Failed' "
    "for rules the schemas do not carry (a status description over 140 characters, a check-run title "
    "over 65535), yet documents 422 on only some operations.",
]

_formats = FormatChecker(formats=())


@_formats.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if isinstance(value, str):
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


def _convert(node: Any) -> Any:
    """OpenAPI 3.0 schema objects -> JSON Schema 2020-12, over the whole document."""
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _convert(schema) for name, schema in value.items()}
        elif key == "$ref" and isinstance(value, str) and value.startswith("#/"):
            out[key] = BASE + value
        elif key == "oneOf":
            out["anyOf"] = _convert(value)
        elif key != "nullable":
            out[key] = _convert(value)
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _relax(doc: dict[str, Any]) -> None:
    body = doc["paths"]["/repos/{owner}/{repo}/issues/{issue_number}/labels"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    schema["anyOf"].append({"type": "array", "minItems": 1, "items": {"type": "string"}})


@functools.cache
def load() -> Spec:
    """The vendored description, parsed once per process (it is only read)."""
    return Spec()


class Spec:
    def __init__(self, path: Path = SPEC_FILE):
        raw = json.loads(path.read_text())
        self.version = raw["info"]["version"]
        self.doc = _convert(raw)
        _relax(self.doc)
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(BASE, resource)
        self._validators: dict[str, Draft202012Validator] = {}

    def operation(self, method: str, template: str) -> dict[str, Any] | None:
        return self.doc["paths"].get(template, {}).get(method.lower())

    def _deref(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            target: Any = self.doc
            for part in node["$ref"].removeprefix(BASE + "#/").split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            node = target
        return node

    def _errors(self, key: str, schema: dict[str, Any], instance: Any, where: str) -> list[str]:
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = Draft202012Validator(
                schema, registry=self.registry, format_checker=_formats
            )
        found = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))[:5]
        return [f"{where}{''.join(f'/{p}' for p in e.absolute_path)}: {_short(e.message)}" for e in found]

    def request_errors(
        self, method: str, template: str, path_params: dict[str, str], query: dict[str, str], body: Any, has_body: bool
    ) -> list[str]:
        op = self.operation(method, template)
        assert op is not None, (method, template)
        item = self.doc["paths"][template]
        errors = []
        for param in [self._deref(p) for p in item.get("parameters", []) + op.get("parameters", [])]:
            source = path_params if param["in"] == "path" else query if param["in"] == "query" else None
            if source is None:
                continue
            name = param["name"]
            if name not in source:
                if param.get("required"):
                    errors.append(f"{param['in']} parameter {name!r} is missing")
                continue
            value, problem = _coerce(source[name], param.get("schema", {}))
            if problem:
                errors.append(f"{param['in']} parameter {name!r}: {problem}")
                continue
            errors += self._errors(
                f"{method} {template} param {name}", param.get("schema", {}), value, f"{param['in']} parameter {name!r}"
            )
        request_body = op.get("requestBody")
        if request_body:
            if not has_body:
                if request_body.get("required"):
                    errors.append("request body is missing")
            else:
                schema = request_body["content"]["application/json"]["schema"]
                errors += self._errors(f"{method} {template} body", schema, body, "body")
        return errors

    def response_errors(self, method: str, template: str, status: int, body: bytes) -> list[str]:
        op = self.operation(method, template)
        assert op is not None, (method, template)
        entry = op["responses"].get(str(status))
        if status == 304:
            return [] if not body else ["a 304 answer must have no body"]
        if entry is None:
            if status not in GLOBAL_STATUSES:
                return [f"status {status} is not documented for {op.get('operationId')}"]
            entry = {"content": {"application/json": {"schema": {"$ref": f"{BASE}#/components/schemas/basic-error"}}}}
        entry = self._deref(entry)
        media = next((m for k, m in (entry.get("content") or {}).items() if "json" in k), None)
        if media is None or "schema" not in media:
            return [] if not body else [f"status {status} of {op.get('operationId')} should have no body"]
        try:
            parsed = json.loads(body)
        except ValueError:
            return [f"status {status} body is not JSON"]
        return self._errors(f"{method} {template} {status}", media["schema"], parsed, "response")

    def webhook_errors(self, event: str, body: dict[str, Any]) -> list[str]:
        name = event.replace("_", "-") + (f"-{body['action'].replace('_', '-')}" if "action" in body else "")
        hook = self.doc["x-webhooks"].get(name)
        if hook is None:
            return [f"webhook {name} is not in the vendored description"]
        schema = hook["post"]["requestBody"]["content"]["application/json"]["schema"]
        return self._errors(f"webhook {name}", schema, body, f"webhook {name}")


def _coerce(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """A path or query string as the JSON value its schema describes."""
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    try:
        if kind == "integer":
            return int(text), None
        if kind == "number":
            return float(text), None
    except ValueError:
        return None, f"{text!r} is not a {kind}"
    if kind == "boolean":
        if text not in ("true", "false"):
            return None, f"{text!r} is not a boolean"
        return text == "true", None
    if kind == "array":
        return text.split(","), None
    return text, None


def _short(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[:limit] + "..."
