"""docs/settings.md is generated from the settings model, and conf/defaults.toml lists every
setting with a comment and the model's default."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from dispatch import settings_doc
from dispatch.settings import ENV_PREFIX, load_settings
from dispatch.settings_doc import (
    DEFAULTS_PATH,
    DOC_PATH,
    default_of,
    defaults_problems,
    env_name,
    render,
    sections,
    toml_value,
)

DEFAULTS = DEFAULTS_PATH.read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _no_dispatch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The defaults are the subject: the caller's DISPATCH_* variables must not change them.
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def test_docs_settings_md_is_what_the_model_makes_now() -> None:
    assert DOC_PATH.read_text(encoding="utf-8") == render(), (
        "docs/settings.md is stale: run `python -m dispatch.settings_doc`"
    )


def test_every_section_and_every_setting_says_what_it_means() -> None:
    for name, model in sections().items():
        # A class's own docstring: Python does not inherit __doc__.
        assert model.__doc__, f"[{name}] ({model.__name__}) has no docstring"
        for key, field in model.model_fields.items():
            assert field.description, f"{name}.{key} has no docstring"


def test_every_setting_has_a_row_in_docs_settings_md() -> None:
    text = DOC_PATH.read_text(encoding="utf-8")
    for name, model in sections().items():
        assert f"## `[{name}]`" in text
        for key in model.model_fields:
            assert f"| `{key}` |" in text and f"`{env_name(name, key)}`" in text


def test_conf_defaults_toml_lists_every_setting_with_a_comment_and_its_default() -> None:
    assert defaults_problems(DEFAULTS) == []


def test_a_setting_missing_from_the_defaults_is_found() -> None:
    text = DEFAULTS.replace("access_log = false", "")
    assert defaults_problems(text) == ["api.access_log: missing"]


def _uncommented(text: str, prefix: str) -> str:
    """`text` with the comment of the line starting with `prefix` taken off."""
    return "\n".join(
        line.partition("#")[0].rstrip() if line.startswith(prefix) else line
        for line in text.splitlines()
    )


def test_a_setting_without_a_comment_is_found() -> None:
    assert defaults_problems(_uncommented(DEFAULTS, "worker_cores =")) == [
        "spark.worker_cores: no comment on its line"
    ]
    # A table-valued setting is commented on its table's header.
    assert defaults_problems(_uncommented(DEFAULTS, "[dispatcher.caps]")) == [
        "dispatcher.caps: no comment on its line"
    ]


def test_a_default_that_differs_from_the_model_is_found() -> None:
    text = DEFAULTS.replace("ttl_s = 3.0 ", "ttl_s = 4.0 ").replace("brokers = 1 ", "brokers = 2 ")
    assert defaults_problems(text) == [
        "kafka.brokers: 2, the model says 1",
        "lease.ttl_s: 4.0, the model says 3.0",
    ]


def test_an_unknown_key_or_section_is_found() -> None:
    text = DEFAULTS + "\n[jvm.extra]  # x\n\n[other]\nkey = 1  # y\n"
    assert defaults_problems(text) == ["jvm.extra: not a setting", "[other]: not a section"]


def test_a_hash_inside_a_string_starts_no_comment() -> None:
    text = _uncommented(DEFAULTS, "bucket =").replace('"dispatch"', '"dis#patch"')
    assert "storage.bucket: no comment on its line" in defaults_problems(text)


@pytest.mark.parametrize(
    ("section", "key"),
    [(name, key) for name, model in sections().items() for key in model.model_fields],
)
def test_a_default_written_as_toml_reads_back_as_itself(section: str, key: str) -> None:
    default = default_of(sections()[section], key)
    assert tomllib.loads(f"x = {toml_value(default)}")["x"] == default


def test_the_documented_variable_sets_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name("jvm", "quick_start"), "true")
    monkeypatch.setenv(env_name("spark", "executor_fold_min_records"), "7")
    monkeypatch.setenv(env_name("api", "ports"), "[9000, 9001]")
    settings = load_settings()
    assert settings.jvm.quick_start is True
    assert settings.spark.executor_fold_min_records == 7
    assert settings.api.ports == [9000, 9001]


def test_check_fails_on_a_stale_doc(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert settings_doc.main(["--check"]) == 0
    stale = tmp_path / "settings.md"
    stale.write_text("# Settings\n")
    monkeypatch.setattr(settings_doc, "DOC_PATH", stale)
    assert settings_doc.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
