"""recurvit.study.study_file: a study file read into its typed keys (OmegaConf structured configs); an unknown
key, a missing one or a value of the wrong type is one line naming the key."""
from pathlib import Path

import pytest
import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.errors import UserError
from recurvit.study.spec import load_study
from recurvit.study.study_file import RegistrationKeys, StudyFile, read_study_file

GOOD = {"name": "tiny", "base": "base.yaml", "grid": {"train.seed": [0, 1]}}


def write(folder: Path, doc) -> Path:
    (folder / "base.yaml").write_text("model: {name: bvit_tiny}\n")
    path = folder / "study.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def one_line(folder: Path, doc) -> str:
    with pytest.raises(UserError) as e:
        load_study(write(folder, doc))
    msg = str(e.value)
    assert "\n" not in msg and "study.yaml" in msg, msg
    return msg


@pytest.mark.parametrize("doc,needle", [
    ({**GOOD, "nmae": "x"}, "unknown key 'nmae'; did you mean 'name'?"),
    ({**GOOD, "zzz": 1}, "unknown key 'zzz' (known: name, task, base, from, overrides, grid, eval, report, runs,"),
    ({**GOOD, "report": {"comapre": []}}, "unknown key 'report.comapre'; did you mean 'report.compare'?"),
    ({**GOOD, "registration": {"n": 2, "seeds": [0, 1], "budgte": "x"}}, "unknown key 'registration.budgte'"),
    ({**GOOD, "registration": 3}, "registration: must be a mapping (n, seeds, checkpoint, budget)"),
    ({**GOOD, "registration": {"n": 3, "seeds": [0, 1]}}, "registration needs n (an integer) and seeds (n of them)"),
    ({**GOOD, "report": {"frontier": "maybe"}}, "report.frontier: "),
    ({**GOOD, "eval": [1]}, "'eval:' must be a mapping (key: value lines), got a list"),
    ({k: v for k, v in GOOD.items() if k != "name"}, "needs a 'name:' entry"),
    ({k: v for k, v in GOOD.items() if k != "grid"}, "needs a 'grid:' entry"),
    ({k: v for k, v in GOOD.items() if k != "base"}, "needs a 'base:' entry"),
    ({**GOOD, "name": "a/b"}, "name must be one word"),
])
def test_a_bad_study_file_is_one_line_naming_the_key(tmp_path, doc, needle):
    assert needle in one_line(tmp_path, doc)


def test_the_keys_are_typed_and_from_is_read_as_from_(tmp_path):
    keys = read_study_file(write(tmp_path, {**GOOD, "from": {"study": "other.yaml"},
                                            "registration": {"n": 2, "seeds": [0, 1], "budget": "3 epochs"},
                                            "overrides": {"train.epochs": 2, "train.note": "run_${v}"}}))
    assert isinstance(keys, StudyFile) and keys.from_ == {"study": "other.yaml"}
    assert keys.registration == RegistrationKeys(n=2, seeds=[0, 1], checkpoint="last", budget="3 epochs")
    assert keys.overrides == {"train.epochs": 2, "train.note": "run_${v}"}  # a shell variable stays text
    study = load_study(write(tmp_path, {**GOOD, "registration": {"n": 2, "seeds": [0, 1]}}))
    assert study.registration.n == 2 and study.registration.checkpoint == "last"
    assert load_study(write(tmp_path, GOOD)).registration is None
