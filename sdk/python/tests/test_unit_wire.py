"""Unit tests: every model class is held to the API's contract, api/openapi.yaml.

The models (the dataclasses ``from_dict`` builds, and :class:`Snapshot`)
are the Python SDK's copy of the API's wire types. For each, this test
finds which model field every property of its schema feeds, by building
the model from objects that differ in that property alone, and fails for
a property that feeds no field (the model lacks it), a field no property
feeds (the schema lacks it), and a field whose being required (no default)
is not the property's being required by the schema, unless ``EXCEPTIONS``
says why. Every class of the package with a ``from_dict`` must be in
``MODELS`` or ``NOT_WIRE``.

It reads ``openapi.json``, the document as JSON (Python's standard library
has no YAML parser), which ``make generate`` writes from api/openapi.yaml
and a Go test (api/internal/specjson) keeps current.
"""

import copy
import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import re
import unittest
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import _helpers  # noqa: F401  (puts src on sys.path)
import pandastack
from pandastack import code_interpreter, events, models, processes, snapshot, templates, volume
from pandastack.filesystem import WatchEvent

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openapi.json")


def _load_spec() -> Dict[str, Any]:
    with open(SPEC_PATH, encoding="utf-8") as f:
        return json.load(f)


class Schema:
    """A schema of the document with $ref and allOf resolved."""

    def __init__(self, doc: Dict[str, Any], node: Any, depth: int = 0) -> None:
        if depth > 32:
            raise ValueError("schemas nest deeper than 32 (a $ref cycle?)")
        node = _deref(doc, node)
        self.type: str = node.get("type", "")
        self.format: str = node.get("format", "")
        self.enum: List[Any] = list(node.get("enum") or [])
        self.nullable: bool = node.get("nullable") is True
        self.one_of = "oneOf" in node or "anyOf" in node
        self.properties: Dict[str, "Schema"] = {}
        self.required: Set[str] = set(node.get("required") or [])
        for part in node.get("allOf") or []:
            ps = Schema(doc, part, depth + 1)
            if not ps.properties and not self.properties and not node.get("properties"):
                # allOf: [{$ref}] with a description: the part is the whole.
                self.__dict__.update(ps.__dict__)
                continue
            self.properties.update(ps.properties)
            self.required |= ps.required
            self.type = "object"
        for name, p in (node.get("properties") or {}).items():
            self.properties[name] = Schema(doc, p, depth + 1)
        self.items: Optional[Schema] = Schema(doc, node["items"], depth + 1) if "items" in node else None
        ap = node.get("additionalProperties")
        self.values: Optional[Schema] = Schema(doc, ap, depth + 1) if isinstance(ap, dict) else None
        if not self.type and self.properties:
            self.type = "object"

    def sample(self, variant: int, where: str) -> Any:
        """A value of this schema; variants 0 and 1 differ wherever they can."""
        if self.one_of:
            return ["auto", "spread"][variant % 2]
        if self.enum:
            return self.enum[variant % len(self.enum)]
        if self.type == "object" or self.properties:
            if self.properties:
                return {k: p.sample(variant, where + "." + k) for k, p in self.properties.items()}
            v = self.values.sample(variant, where + ".*") if self.values else "v%d" % variant
            return {"k%d" % variant: v}
        if self.type == "array":
            return [self.items.sample(variant, where + "[]") if self.items else "x%d" % variant]
        if self.type == "string":
            if self.format == "date-time":
                return "2024-05-0%dT12:00:0%dZ" % (1 + variant, variant)
            return "%s-%d" % (where, variant)
        if self.type == "integer":
            return 10 + variant
        if self.type == "number":
            return 1.5 + variant
        if self.type == "boolean":
            return variant == 0
        return "any-%d" % variant


def _deref(doc: Dict[str, Any], node: Any) -> Dict[str, Any]:
    while isinstance(node, dict) and "$ref" in node:
        node = pointer(doc, node["$ref"])
    if not isinstance(node, dict):
        raise ValueError("a schema is a %s, not an object" % type(node).__name__)
    return node


def pointer(doc: Dict[str, Any], ref: str) -> Any:
    """The node at a local JSON pointer ("#/components/schemas/Sandbox")."""
    if not ref.startswith("#/"):
        raise ValueError("$ref %r: only local references are supported" % ref)
    node: Any = doc
    for tok in ref[2:].split("/"):
        tok = tok.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or tok not in node:
            raise KeyError("$ref %r names nothing (at %r)" % (ref, tok))
        node = node[tok]
    return node


def component(name: str) -> str:
    return "#/components/schemas/" + name


def answer(method: str, path: str, status: str, *rest: str) -> str:
    """The pointer to the JSON schema of an operation's answer (and below it)."""
    p = "#/paths/%s/%s/responses/%s/content/application~1json/schema" % (path.replace("~", "~0").replace("/", "~1"), method.lower(), status)
    return "/".join((p,) + rest)


@dataclasses.dataclass
class Model:
    cls: type
    schema: str  # a JSON pointer into the document
    build: Optional[Callable[[Dict[str, Any]], Any]] = None  # default: cls.from_dict

    def make(self, d: Dict[str, Any]) -> Any:
        return (self.build or self.cls.from_dict)(d)


def _snapshot(d: Dict[str, Any]) -> Any:
    return snapshot.Snapshot(d, client=None)  # type: ignore[arg-type]


def _volume(d: Dict[str, Any]) -> Any:
    return volume.Volume(d, client=None)  # type: ignore[arg-type]


def _event(d: Dict[str, Any]) -> Any:
    return events._event(d, lambda s: dict(s))


def _code_stream(d: Dict[str, Any]) -> Any:
    """The Execution of a stream of events that share d's fields: each event
    type that has some of them, then end (CodeEvent is all types' fields in
    one object, each event type reading its own)."""
    run = code_interpreter.CodeRun("sandbox")
    kinds = [("stdout", ("text",)), ("result", ("is_main_result", "data", "chart")), ("error", ("name", "value", "traceback"))]
    for kind, keys in kinds:
        if any(k in d for k in keys):
            run.add(dict(d, type=kind))
    run.add(dict(d, type="end"))
    return run.execution()


MODELS = [
    Model(models.SandboxInfo, component("Sandbox")),
    Model(models.MemoryUsage, component("Sandbox") + "/properties/memory"),
    Model(models.LazyMemory, component("Sandbox") + "/properties/memory/properties/lazy"),
    Model(models.NetworkPolicy, component("NetworkPolicy")),
    Model(models.ExecResult, component("ExecResult")),
    Model(models.FileInfo, component("FileInfo")),
    Model(models.Port, component("ListeningPort")),
    Model(models.Template, component("Template")),
    Model(models.TemplateVersion, component("Template") + "/properties/versions/items"),
    Model(models.APIKey, answer("POST", "/v1/keys", "201")),
    Model(templates.TemplateBuild, component("TemplateBuild")),
    Model(processes.ProcessInfo, component("Process")),
    Model(events.Event, component("Event"), _event),
    Model(events.CommandRecord, component("Command")),
    Model(WatchEvent, component("WatchEvent")),
    Model(snapshot.Snapshot, component("Snapshot"), _snapshot),
    Model(volume.Volume, component("Volume"), _volume),
    Model(models.VolumeMount, component("Sandbox") + "/properties/volumes/items"),
    Model(code_interpreter.CodeContext, component("CodeContext")),
    Model(code_interpreter.Execution, component("CodeEvent"), _code_stream),
]

# Classes with a from_dict that are no wire type of the document, and why.
NOT_WIRE: Dict[str, str] = {
    "Result": "a result event's part of CodeEvent: held to it through Execution (the decoding of a whole stream)",
    "ExecutionError": "an error event's part of CodeEvent: held to it through Execution (the decoding of a whole stream)",
}

# (class name, field or property): why the model and the schema differ there.
_COMPAT = "always sent, but the model's field has a default: making it required would change the class's constructor"
EXCEPTIONS: Dict[Tuple[str, str], str] = {
    ("APIKey", "key"): "one model for the list (no key) and create's answer (key required): optional here",
    ("Event", "seq"): "absent on overflow only (pings are skipped), read as 0 as documented; a default would need one for time too",
    ("SandboxInfo", "metadata"): _COMPAT,
    ("TemplateBuild", "created_at"): _COMPAT,
    ("TemplateBuild", "from_image"): _COMPAT,
    ("ExecResult", "stdout"): "required for exec, but the streams' exit events (also ExecResult) carry no output",
    ("ExecResult", "stderr"): "required for exec, but the streams' exit events (also ExecResult) carry no output",
    ("Execution", "type"): "which event a line is: the check gives each event type the sample's fields in turn",
}

# Fields that hold the object as received, not a property.
RAW_FIELDS = {"raw"}


def _fields(obj: Any) -> Dict[str, Any]:
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in RAW_FIELDS}
    return {k: v for k, v in vars(obj).items() if not k.startswith("_") and k not in RAW_FIELDS}


def _model_required(cls: type) -> Optional[Dict[str, bool]]:
    """Field name → it has no default; None for a class that is no dataclass."""
    if not dataclasses.is_dataclass(cls):
        return None
    return {
        f.name: f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        for f in dataclasses.fields(cls)
        if f.name not in RAW_FIELDS
    }


_MISSING = object()


def feeds(m: Model, s: Schema) -> Dict[str, Set[str]]:
    """Property name → the model fields it changes."""
    name = m.cls.__name__
    base = s.sample(0, name)
    out: Dict[str, Set[str]] = {}
    for prop, ps in s.properties.items():
        changed: Set[str] = set()
        a = _fields(m.make(base))
        for v in (ps.sample(1, name + "." + prop), _MISSING):
            d = copy.deepcopy(base)
            if v is _MISSING:
                del d[prop]
            else:
                d[prop] = v
            b = _fields(m.make(d))
            changed |= {k for k in a if a[k] != b[k]}
        out[prop] = changed
    return out


def differences(m: Model, doc: Dict[str, Any]) -> List[str]:
    name = m.cls.__name__
    s = Schema(doc, pointer(doc, m.schema))
    if s.type != "object" or not s.properties:
        return ["%s: its schema %s is no object with properties" % (name, m.schema)]
    fed = feeds(m, s)
    out = []
    fields = set(_fields(m.make(s.sample(0, name))))
    fed_fields: Set[str] = set()
    for prop, fs in sorted(fed.items()):
        fed_fields |= fs
        if not fs and (name, prop) not in EXCEPTIONS:
            out.append("%s: the schema has the property %r, the model has no field for it (from_dict does not read it)" % (name, prop))
    for f in sorted(fields - fed_fields):
        if (name, f) not in EXCEPTIONS:
            out.append("%s: the model has the field %r, which no property of the schema feeds" % (name, f))
    required = _model_required(m.cls)
    if required is not None:
        for prop, fs in sorted(fed.items()):
            for f in sorted(fs):
                if (name, prop) in EXCEPTIONS or (name, f) in EXCEPTIONS:
                    continue
                # A required property that may be null has no value to
                # require: the model gives it a default (None).
                always = prop in s.required and not s.properties[prop].nullable
                if required[f] != always:
                    out.append(
                        "%s.%s: the schema has %r %s, the model's field %s %s"
                        % (name, f, prop, "always set (required, not nullable)" if always else "optional (or nullable)", f,
                           "has no default (required)" if required[f] else "has a default (optional)")
                    )
    return out


class WireTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.doc = _load_spec()

    def test_models_match_the_spec(self) -> None:
        diffs: List[str] = []
        for m in MODELS:
            diffs += differences(m, self.doc)
        self.assertEqual(diffs, [], "\n" + "\n".join(diffs))

    def test_every_model_is_checked(self) -> None:
        checked = {m.cls for m in MODELS}
        missing = []
        for info in pkgutil.iter_modules(pandastack.__path__):
            mod = importlib.import_module("pandastack." + info.name)
            for _, obj in inspect.getmembers(mod, inspect.isclass):
                if obj.__module__ != mod.__name__ or not hasattr(obj, "from_dict"):
                    continue
                if obj not in checked and obj.__name__ not in NOT_WIRE:
                    missing.append("%s.%s" % (mod.__name__, obj.__name__))
        self.assertEqual(missing, [], "models not held to the spec: add them to MODELS in %s (or to NOT_WIRE, saying why)" % __file__)

    def test_exceptions_are_used(self) -> None:
        by_class = {m.cls.__name__: m for m in MODELS}
        for (cls, name), why in EXCEPTIONS.items():
            m = by_class.get(cls)
            self.assertIsNotNone(m, "EXCEPTIONS names %s, which is not in MODELS" % cls)
            s = Schema(self.doc, pointer(self.doc, m.schema))
            fields = _fields(m.make(s.sample(0, cls)))
            self.assertTrue(name in s.properties or name in fields, "EXCEPTIONS[%r] (%s): neither the schema nor the model has %r" % ((cls, name), why, name))

    def test_error_codes_match_the_spec(self) -> None:
        """The error codes the SDK knows are the document's, with its statuses."""
        from pandastack import errors

        codes = Schema(self.doc, pointer(self.doc, component("ErrorDetail"))).properties["code"].enum
        table = {m.group(2): int(m.group(1)) for m in re.finditer(r"(?m)^\|\s*(\d{3})\s*\|\s*([a-z_]+)\s*\|", self.doc["info"]["description"])}
        self.assertEqual(sorted(errors.CODE_TO_STATUS), sorted(codes), "CODE_TO_STATUS vs ErrorDetail.code")
        self.assertEqual(errors.CODE_TO_STATUS, table, "CODE_TO_STATUS vs the error table of the document's description")
        self.assertEqual(sorted(set(errors.CODE_TO_CLASS) - set(codes)), [], "CODE_TO_CLASS has codes the document does not list")

    def test_the_check_finds_drift(self) -> None:
        """A model that lost a property, gained one, or made one required is caught."""

        @dataclasses.dataclass(frozen=True)
        class Drifted:
            port: int
            extra: str
            stale: str = "never sent"
            raw: Dict[str, Any] = dataclasses.field(default_factory=dict)

            @classmethod
            def from_dict(cls, d: Dict[str, Any]) -> "Drifted":
                return cls(port=int(d.get("port") or 0), extra=str(d.get("address")), raw=dict(d))

        doc = copy.deepcopy(self.doc)
        lp = doc["components"]["schemas"]["ListeningPort"]
        lp["required"] = ["port"]
        lp["properties"]["missing"] = {"type": "string"}
        got = differences(Model(Drifted, component("ListeningPort")), doc)
        self.assertEqual(
            got,
            [
                "Drifted: the schema has the property 'missing', the model has no field for it (from_dict does not read it)",
                "Drifted: the model has the field 'stale', which no property of the schema feeds",
                "Drifted.extra: the schema has 'address' optional (or nullable), the model's field extra has no default (required)",
            ],
        )


if __name__ == "__main__":
    unittest.main()
