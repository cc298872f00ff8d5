"""docs/settings.md, generated from the settings model: `python -m dispatch.settings_doc`.

A setting's meaning is written once, as its field's docstring in dispatch/settings.py (a
section's, as its class's docstring); this module renders them, with each field's type,
constraints, default and environment variable, as one table per section.

conf/defaults.toml is written by hand (short comments, grouped as an operator reads them), but
`defaults_problems` holds it to the model: every setting present, commented, at the model's
default. `--check` writes nothing and fails on a stale docs/settings.md or on such a problem
(the unit tests do the same).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tomllib
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from dispatch.settings import PROFILES_DIR, PROJECT_ROOT, Settings

DOC_PATH = PROJECT_ROOT / "docs" / "settings.md"
DEFAULTS_PATH = PROJECT_ROOT / "conf" / "defaults.toml"
COMMAND = "python -m dispatch.settings_doc"

# JSON schema's names, as a TOML file spells the values.
_TYPES = {
    "string": "string",
    "integer": "integer",
    "number": "float",
    "boolean": "boolean",
    "array": "array",
    "object": "table",
}


def sections() -> dict[str, type[BaseModel]]:
    """Every section of the settings (a TOML table each), by name, in the model's order."""
    found: dict[str, type[BaseModel]] = {}
    for name, field in Settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"settings field {name!r} is not a section (a pydantic model)")
        found[name] = model
    return found


def env_name(section: str, key: str) -> str:
    """The environment variable that sets `section.key`."""
    config = Settings.model_config
    prefix, delimiter = config.get("env_prefix", ""), config.get("env_nested_delimiter") or ""
    return f"{prefix}{section}{delimiter}{key}".upper()


def toml_value(value: Any) -> str:
    """`value` (JSON-able) as a TOML file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # A JSON string is a TOML basic string (same escapes).
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def default_of(model: type[BaseModel], key: str) -> Any:
    """The field's default, as the TOML file (and the JSON of an environment variable) holds
    it: a path as a string, a factory's product."""
    field = model.model_fields[key]
    return to_jsonable_python(field.get_default(call_default_factory=True))


def type_text(schema: dict[str, Any]) -> str:
    """A property's JSON schema as a reader of a TOML file wants it: the type, then what
    validation asks of the value."""
    kind = _TYPES[schema["type"]]
    if schema.get("format") == "path":
        kind = "path"
    if "items" in schema:
        kind += f" of {_TYPES[schema['items']['type']]}s"
    if "additionalProperties" in schema:
        kind += f" of {_TYPES[schema['additionalProperties']['type']]}s"
    rules = [
        f"{sign} {schema[bound]}"
        for bound, sign in (
            ("exclusiveMinimum", ">"),
            ("minimum", "≥"),
            ("maximum", "≤"),
        )
        if bound in schema
    ]
    if "minItems" in schema:
        rules.append(f"at least {schema['minItems']}")
    if "minLength" in schema:
        rules.append("not empty")
    if "pattern" in schema:
        rules.append(f"matching `{schema['pattern']}`")
    return ", ".join([kind, *rules])


def _one_line(text: str) -> str:
    # A table cell is one line; a `|` would end it.
    return " ".join(text.split()).replace("|", "\\|")


def _paragraphs(docstring: str | None) -> str:
    return "\n\n".join(
        " ".join(block.split()) for block in inspect.cleandoc(docstring or "").split("\n\n")
    )


def _section_table(name: str, model: type[BaseModel]) -> list[str]:
    properties = model.model_json_schema()["properties"]
    lines = [
        f"## `[{name}]`",
        "",
        _paragraphs(model.__doc__),
        "",
        "| Key | Type | Default | Environment variable | Meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, field in model.model_fields.items():
        if not field.description:
            raise ValueError(f"{name}.{key} has no description: give the field a docstring")
        cells = [
            f"`{key}`",
            _one_line(type_text(properties[key])),
            f"`{_one_line(toml_value(default_of(model, key)))}`",
            f"`{env_name(name, key)}`",
            _one_line(field.description),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _profile_lines() -> list[str]:
    lines = [
        "## Profiles",
        "",
        "A profile (`dispatch up --profile <name>` or `DISPATCH_PROFILE=<name>`) is read over",
        "`conf/defaults.toml`; the environment still wins over both. What each one changes:",
        "",
    ]
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        with path.open("rb") as source:
            overlay = tomllib.load(source)
        changes = [
            f"`{section}.{key} = {toml_value(value)}`"
            for section, values in overlay.items()
            for key, value in values.items()
        ]
        lines.append(f"- `{path.stem}` (`conf/profiles/{path.name}`): " + ", ".join(changes) + ".")
    return [*lines, ""]


def render() -> str:
    """The whole of docs/settings.md, as the model makes it now."""
    lines = [
        "# Settings",
        "",
        f"*Generated by `{COMMAND}` from the settings model, `dispatch/settings.py`,",
        "where a setting's meaning is its field's docstring. Do not edit this file: change the",
        "model and run the command again (a unit test fails while the two differ).*",
        "",
        "Every dispatch process reads one typed settings object. Sources, highest first:",
        "keyword arguments (tests), environment variables, a profile's overlay",
        "(`conf/profiles/<name>.toml`), then `conf/defaults.toml` (or the file `DISPATCH_CONFIG`",
        "names), which lists every setting below with its default. A setting's environment",
        "variable is `DISPATCH_<SECTION>__<KEY>`; an array or a table is given there as JSON",
        "(`DISPATCH_API__PORTS='[9000, 9001]'`). Unknown keys and invalid values are refused at",
        "start, naming the setting and its variable. Relative paths are taken against the",
        "project root (the folder holding `conf/`) unless a row says otherwise.",
        "",
    ]
    for name, model in sections().items():
        lines += _section_table(name, model)
    lines += _profile_lines()
    return "\n".join(lines).rstrip("\n") + "\n"


def _comments(text: str) -> dict[str, str]:
    """`section.key` -> the comment on its line, for every key and sub-table of a TOML text
    ("" when the line has none)."""
    found: dict[str, str] = {}
    table = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        # A `#` starts the comment when the text before it is a whole TOML line; one inside a
        # string leaves that text unterminated.
        cuts = [i for i, char in enumerate(line) if char == "#"] + [len(line)]
        for cut in cuts:
            try:
                tomllib.loads(line[:cut])
            except tomllib.TOMLDecodeError:
                continue
            break
        else:
            # A value spread over lines: it has no comment on its key's line.
            cut = len(line)
        code, comment = line[:cut].strip(), line[cut + 1 :].strip()
        if code.startswith("[") and code.endswith("]"):
            table = code.strip("[]").strip()
            if "." in table:  # `[section.key]`: a table-valued setting
                found[table] = comment
        else:
            found[f"{table}.{code.partition('=')[0].strip()}"] = comment
    return found


def defaults_problems(text: str) -> list[str]:
    """What keeps a defaults file (conf/defaults.toml's text) from listing every setting of
    the model, each with a comment and with the model's default; empty when nothing does."""
    values = tomllib.loads(text)
    comments = _comments(text)
    problems: list[str] = []
    for section, model in sections().items():
        table = values.get(section, {})
        for key in model.model_fields:
            name = f"{section}.{key}"
            if key not in table:
                problems.append(f"{name}: missing")
                continue
            default = default_of(model, key)
            if table[key] != default or type(table[key]) is not type(default):
                problems.append(
                    f"{name}: {toml_value(table[key])}, the model says {toml_value(default)}"
                )
            if not comments.get(name):
                problems.append(f"{name}: no comment on its line")
        problems += [
            f"{section}.{key}: not a setting" for key in table.keys() - model.model_fields.keys()
        ]
    problems += [f"[{section}]: not a section" for section in values.keys() - sections().keys()]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Write docs/settings.md.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if docs/settings.md is stale or conf/defaults.toml "
        "misses a setting, its comment or its default",
    )
    check = parser.parse_args(argv).check
    text = render()
    if not check:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
        return 0
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.is_file() else ""
    problems = [] if current == text else [f"{DOC_PATH}: stale, run `{COMMAND}`"]
    problems += [
        f"{DEFAULTS_PATH}: {problem}"
        for problem in defaults_problems(DEFAULTS_PATH.read_text(encoding="utf-8"))
    ]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
