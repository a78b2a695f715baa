"""Study files and configs a user can get wrong, each one line (issue 57, items 11 and 14): nested 5,000 levels
(a 3,000-line RecursionError), far too large (a 200 MB file parsed for 90 s into a MemoryError), a key given
twice (the message said "while constructing a mapping" without naming the key)."""
import pytest

from recurvit.config import load_config
from recurvit.errors import UserError
from recurvit.study.spec import load_study


def _deep(n=5000):
    return "a: " + "[" * n + "]" * n + "\n"


def test_a_study_file_nested_too_deeply_or_too_large_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text(_deep())
    with pytest.raises(UserError, match="nested too deeply") as e:
        load_study(deep)
    assert "\n" not in str(e.value)
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# padding\n" * 200_000)
    with pytest.raises(UserError, match=r"is 2,000,008 bytes; a study file is a YAML file of a few KB"):
        load_study(big)


def test_a_config_nested_too_deeply_too_large_or_with_a_key_twice_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text(_deep())
    with pytest.raises(UserError, match="nested too deeply|maximum nesting depth") as e:
        load_config(deep)
    assert "\n" not in str(e.value)
    big = tmp_path / "big.yaml"
    big.write_text("train: {epochs: 1}\n" + "# padding\n" * 200_000)
    with pytest.raises(UserError, match="bytes; a config is a YAML file of a few KB"):
        load_config(big)
    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  epochs: 1\n  epochs: 2\n")
    with pytest.raises(UserError, match="epochs") as e:
        load_config(twice)
    assert "\n" not in str(e.value)
