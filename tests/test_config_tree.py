"""Config trees: YAML presets, dotted overrides, type coercion and clear errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from memprism_ray.config_tree import describe, field, from_dict, load_yaml, parse_overrides, set_path, to_dict


@dataclass
class Inner:
    lr: float = field(3e-6, help="learning rate")
    steps: int = field(50, help="max steps")
    mode: Literal["optical", "text"] = field("optical", help="view medium")
    tags: tuple[str, ...] = field((), help="tags")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"inner.lr must be > 0, got {self.lr}")


@dataclass
class Knobs:
    temperature: float = field(1.0, help="sampling temperature")
    seed: int = field(0, help="seed")

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"knobs.temperature must be >= 0, got {self.temperature}")


@dataclass
class WithKnobs:
    knobs: dict[str, Any] = field(default_factory=dict, help="keyword settings", schema=Knobs)
    free: dict[str, Any] = field(default_factory=dict, help="no schema")


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner, help="inner block")
    name: str = field("run", help="run name")
    resume: str | None = field(None, help="checkpoint or auto")
    debug: bool = field(False, help="debug")


def test_overrides_coerce_to_field_types() -> None:
    over = parse_overrides(["--inner.lr", "1e-6", "--inner.steps=10", "--debug", "true", "--inner.tags", "a,b"])
    cfg = from_dict(Outer, over)
    assert cfg.inner.lr == 1e-6 and cfg.inner.steps == 10 and cfg.debug is True
    assert cfg.inner.tags == ("a", "b")
    assert cfg.name == "run" and cfg.resume is None
    assert from_dict(Outer, parse_overrides(["--resume", "auto"])).resume == "auto"
    assert from_dict(Outer, {"resume": "none"}).resume is None


def test_round_trip_through_dict() -> None:
    cfg = from_dict(Outer, {"inner": {"lr": 0.5, "mode": "text"}, "name": "x"})
    assert from_dict(Outer, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"innr": {}}, "unknown setting(s) innr; valid keys: inner, name, resume, debug"),
        ({"inner": {"lrr": 1}}, "unknown setting(s) inner.lrr; valid keys under inner: lr, steps, mode, tags"),
        ({"inner": {"steps": "ten"}}, "inner.steps: expected an integer, got 'ten'"),
        ({"inner": {"mode": "audio"}}, "inner.mode: 'audio' is not one of 'optical', 'text'"),
        ({"inner": {"lr": -1}}, "inner.lr must be > 0"),
        ({"debug": "maybe"}, "debug: expected true/false"),
    ],
)
def test_errors_name_the_setting(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        from_dict(Outer, data)
    assert message in str(err.value)


def test_override_syntax_errors() -> None:
    with pytest.raises(ValueError, match=r"expected a --section\.key override"):
        parse_overrides(["lr", "1"])
    with pytest.raises(ValueError, match="has no value"):
        parse_overrides(["--inner.lr"])
    # A key given again takes the later value (argparse's rule), whichever spelling.
    assert parse_overrides(["--inner.max-steps", "1", "--inner.max_steps=2"]) == {"inner": {"max_steps": "2"}}
    with pytest.raises(ValueError, match=r"^override --inner\.lr\.x conflicts with an earlier one$"):
        parse_overrides(["--inner.lr", "1", "--inner.lr.x", "2"])


def test_set_path_makes_sections_and_refuses_a_value_on_the_way() -> None:
    data: dict[str, Any] = {"inner": {"lr": 1}}
    set_path(data, "inner.steps", 3)
    set_path(data, "policy.scripted.seed", 7)
    assert data == {"inner": {"lr": 1, "steps": 3}, "policy": {"scripted": {"seed": 7}}}
    with pytest.raises(ValueError, match=r"^inner\.lr\.x: lr holds a value"):
        set_path(data, "inner.lr.x", 2)


def test_yaml_presets_inherit_from_base(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("name: base\ninner:\n  lr: 0.1\n  steps: 5\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\ninner:\n  steps: 7\n")
    cfg = from_dict(Outer, load_yaml(tmp_path / "child.yaml"))
    assert (cfg.name, cfg.inner.lr, cfg.inner.steps) == ("base", 0.1, 7)
    with pytest.raises(ValueError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping at the top level"):
        load_yaml(tmp_path / "bad.yaml")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"c.yaml": "run:\n  name: [oops\n"},
            "config file {d}/c.yaml is not valid YAML at line 3, column 1: expected ','",
        ),
        ({"c.yaml": "base: c.yaml\n"}, "config file {d}/c.yaml: its base chain comes back to a preset it started from"),
        ({"c.yaml": "base: b.yaml\n", "b.yaml": "base: c.yaml\n"}, "config file {d}/b.yaml: its base chain comes back"),
        ({"c.yaml": "base: 5\n"}, "config file {d}/c.yaml: base must name a preset file beside it, got 5"),
        ({"c.yaml": "base: sub\n", "sub/x.yaml": ""}, "config file {d}/sub cannot be read: Is a directory"),
        ({"c.yaml": "base: gone.yaml\n"}, "config file {d}/c.yaml: its base {d}/gone.yaml does not exist"),
        ({"c.yaml": b"\xff\xfe name: x"}, "config file {d}/c.yaml is not UTF-8 text (byte 0: invalid start byte)"),
        # PyYAML keeps the last of two equal keys: a setting lost without a word.
        (
            {"c.yaml": "grpo:\n  lr: 1.0e-6\n  beta_kl: 0.1\n  lr: 2.0e-6\n"},
            "config file {d}/c.yaml is not valid YAML at line 4, column 3: key 'lr' is given twice (first at line 2)",
        ),
        (
            {"c.yaml": "grpo:\n  lr: 1.0e-6\nrun:\n  name: a\ngrpo: {}\n"},
            "config file {d}/c.yaml is not valid YAML at line 5, column 1: key 'grpo' is given twice (first at line 1)",
        ),
    ],
)
def test_a_broken_preset_is_one_line_naming_the_file(tmp_path: Path, files: dict[str, Any], message: str) -> None:
    """Each of these ended in a traceback (RecursionError, TypeError, IsADirectoryError) or a
    multi-line YAML error naming ``<unicode string>``."""
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, bytes):
            (tmp_path / name).write_bytes(body)
        else:
            (tmp_path / name).write_text(body)
    with pytest.raises(ValueError) as refused:
        load_yaml(tmp_path / "c.yaml")
    assert str(refused.value).startswith(message.format(d=tmp_path)) and "\n" not in str(refused.value)


def test_describe_lists_every_leaf_with_help() -> None:
    rows = {name: (default, help_) for name, default, help_ in describe(Outer)}
    assert rows["inner.lr"] == ("3e-06", "learning rate")
    assert set(rows) == {"inner.lr", "inner.steps", "inner.mode", "inner.tags", "name", "resume", "debug"}


@pytest.mark.parametrize("value", ["nan", "NaN", float("nan")])
def test_nan_is_never_a_number_setting(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^inner\.lr: expected a number, got "):
        from_dict(Outer, {"inner": {"lr": value}})


@pytest.mark.parametrize("value", ["inf", "-Infinity", "1e400", float("inf")])
def test_infinity_is_never_a_number_setting(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^inner\.lr: expected a finite number, got "):
        from_dict(Outer, {"inner": {"lr": value}})


def test_schema_dict_settings_are_typed_like_fields() -> None:
    # Issue 10: "--policy.scripted.temperature 0.5" stayed the string '0.5' and failed late.
    cfg = from_dict(WithKnobs, parse_overrides(["--knobs.temperature", "0.5", "--knobs.seed", "3"]))
    assert cfg.knobs == {"temperature": 0.5, "seed": 3}
    assert isinstance(cfg.knobs["temperature"], float) and isinstance(cfg.knobs["seed"], int)
    # Only the keys given are kept: the consumer's defaults apply to the rest.
    assert from_dict(WithKnobs, {"knobs": {"seed": "7"}}).knobs == {"seed": 7}
    # A dict without a schema stays free-form.
    assert from_dict(WithKnobs, {"free": {"temperature": "0.5"}}).free == {"temperature": "0.5"}


@pytest.mark.parametrize(
    ("data", "message"),
    [({"knobs": {"temperature": "warm"}}, "knobs.temperature: expected a number, got 'warm'"),
     ({"knobs": {"temp": 1}}, "unknown setting(s) knobs.temp; valid keys under knobs: temperature, seed"),
     ({"knobs": {"temperature": "-1"}}, "knobs.temperature must be >= 0, got -1.0"),
     ({"knobs": {"temperature": "nan"}}, "knobs.temperature: expected a number, got 'nan'"),
     ({"knobs": "hot"}, "knobs: expected a mapping, got 'hot'")],
)  # fmt: skip
def test_schema_dict_errors_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        from_dict(WithKnobs, data)
    assert str(err.value) == message


def test_describe_lists_schema_keys() -> None:
    rows = {name: (default, help_) for name, default, help_ in describe(WithKnobs)}
    assert rows["knobs.temperature"] == ("1.0", "sampling temperature") and rows["knobs.seed"] == ("0", "seed")
    assert rows["free"] == ("{}", "no schema")


@dataclass
class Moved:
    """A section whose flat keys moved into a nested one (as ``label.llm_base_url`` ->
    ``label.llm.base_url``)."""

    RENAMED: ClassVar[dict[str, str]] = {"inner_lr": "inner.lr"}

    inner: Inner = field(default_factory=Inner, help="inner block")


def test_a_renamed_key_is_one_line_naming_the_new_key() -> None:
    with pytest.raises(ValueError) as err:
        from_dict(Outer, {"inner": {}, "moved": {}})  # no RENAMED: the usual list of valid keys
    assert str(err.value).startswith("unknown setting(s) moved; valid keys:")
    with pytest.raises(ValueError) as err:
        from_dict(Moved, {"inner_lr": 0.1, "typo": 1}, _where="sec")
    assert str(err.value) == "sec.inner_lr was renamed sec.inner.lr"
    assert from_dict(Moved, {"inner": {"lr": 0.1}}).inner.lr == 0.1


SEED_SAID = "--seed: expected an integer from 0 to 9223372036854775807, got -1"


@pytest.mark.parametrize(
    ("argv", "said"),
    [(["eval", "--condition", "no_memory", "--seed", "-1"], SEED_SAID),
     (["compare", "a", "b", "--seed", "-1"], SEED_SAID),
     (["router", "init", "out", "--seed", "-1"], SEED_SAID),
     (["games", "build", "--out", "out", "--seed", "-1"], SEED_SAID),
     # memprism compare --boot 0 named the function, not the option ("paired_bootstrap_diff: ...").
     (["compare", "a", "b", "--boot", "0"], "--boot: expected an integer >= 1, got 0")],
)  # fmt: skip
def test_a_command_refuses_a_seed_numpy_or_torch_refuses_and_an_empty_bootstrap(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A seed numpy refuses (negative) or torch does (past 2**64 - 1) is the command's usage error,
    as a :data:`~memprism_ray.config_tree.Seed` setting is the config's (tests/test_config.py)."""
    from memprism_ray.cli import main
    from memprism_ray.config_tree import MAX_SEED, seed_arg

    assert seed_arg("0") == 0 and seed_arg(str(MAX_SEED)) == MAX_SEED == 2**63 - 1
    with pytest.raises(SystemExit) as done:
        main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert done.value.code == 2 and last.endswith(f"argument {said}")
