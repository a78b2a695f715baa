"""`recurvit horizon` on a maze run: solved after every iteration up to K at every test size, in
one pass a batch, the same figures as the library's sweep of the run (analysis/mazes.sweep_run), and one
line with exit 2 for a size no maze can have."""
import csv
import json

import pytest

from recurvit.cli import main

TINY = ["mazes/dt_recall_prog", "data.maze_train=32", "data.maze_val=8", "data.maze_test=4", "data.maze_test_sizes=[9,13]",
        "model.width=8", "model.steps=2", "train.epochs=1", "train.batch_size=16",
        "train.progress=false", "train.device=cpu"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("horizon_mazes") / "run"
    assert main(["train", *TINY, "--out", str(out), "--json"]) == 0
    return out


def test_horizon_sweeps_a_maze_run_like_the_library(run, tmp_path, capsys):
    from recurvit.analysis.mazes import sweep_run

    capsys.readouterr()
    assert main(["horizon", str(run), "--steps", "5", "--sizes", "9", "13", "--mazes", "3", "--out",
                 str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trained_steps"] == 2 and summary["max_steps"] == 5
    rows = list(csv.DictReader(open(tmp_path / "horizon.csv")))
    assert [(int(r["size"]), int(r["step"])) for r in rows] == [(s, k) for s in (9, 13) for k in range(1, 6)]
    want = sweep_run(run, max_steps=5, sizes=[9, 13], n=3)
    for size in (9, 13):
        for col, key in (("solved", "solved"), ("pixel_acc", "accuracy"), ("path_recall", "path_recall"),
                         ("path_precision", "path_precision"), ("state_rms", "state_rms"), ("state_change", "state_change")):
            got = [float(r[col]) if r[col] else None for r in rows if int(r["size"]) == size]
            assert got == pytest.approx(want["sweeps"][size][key], abs=0)
    assert summary["stable_rule"] == {"min_steps": 2, "patience": 3}  # the study evaluator's: from T, patience 3
    assert summary["rows"] == json.loads(json.dumps(want["rows"]))
    assert (tmp_path / "horizon.png").stat().st_size > 0
    saved = json.loads((tmp_path / "horizon.json").read_text())
    assert saved["rows"] == summary["rows"]  # the file names its siblings by name: the folder can move
    assert (saved["csv"], saved["png"], saved["picture"]["png"]) == ("horizon.csv", "horizon.png", "horizon_maze.png")
    pic = summary["picture"]  # the largest size where the stable rule solved a maze, else the largest
    assert (tmp_path / "horizon_maze.png").stat().st_size > 0 and pic["png"] == str(tmp_path / "horizon_maze.png")
    solved = [r["size"] for r in summary["rows"] if r["stable_solved"] > 0]
    assert pic["size"] == max(solved, default=13) and pic["stable_solved"] == bool(solved)


def test_the_picture_is_of_the_largest_size_where_the_stable_rule_solved_a_maze(run, tmp_path, capsys, monkeypatch):
    import recurvit.analysis.mazes as mazes

    real = mazes.maze_sweep_sizes

    def solved_at_9_only(*a, **k):  # as if the rule had solved a 9x9 maze and no 13x13 one
        sweeps = real(*a, **k)
        for size, sw in sweeps.items():
            sw["example"]["solved"] = size == 9
        return sweeps

    monkeypatch.setattr(mazes, "maze_sweep_sizes", solved_at_9_only)
    capsys.readouterr()
    assert main(["horizon", str(run), "--steps", "3", "--sizes", "9", "13", "--mazes", "2", "--out",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "picture: a 9x9 maze, solved by the stable rule" in out
    assert json.loads((tmp_path / "horizon.json").read_text())["picture"]["size"] == 9


def test_the_librarys_sweep_writes_its_json_and_returns_the_example(run, tmp_path):
    from recurvit.analysis.mazes import sweep_run

    got = sweep_run(run, max_steps=3, sizes=[9], n=2, out=tmp_path, example=True, keep=1)
    assert got["sweeps"][9]["example"]["image"].shape == (3, 24, 24) and len(got["sweeps"][9]["kept"]["pred"]) == 1
    written = json.loads((tmp_path / "sweeps.json").read_text())["sweeps"]["9"]
    assert "example" not in written and "kept" not in written and written["solved"] == got["sweeps"][9]["solved"]


def test_the_stable_rule_can_be_set_and_is_reported(run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["horizon", str(run), "--steps", "4", "--sizes", "9", "--mazes", "2", "--min-steps", "1",
                 "--patience", "2", "--out", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stable_rule"] == {"min_steps": 1, "patience": 2}


@pytest.mark.parametrize("bad", [["--sizes", "8"], ["--sizes", "1"], ["--mazes", "0"], ["--patience", "0"],
                                 ["--min-steps", "0"], ["--min-steps", "50"], ["--data-root", "/tmp"]])
def test_a_size_no_maze_can_have_is_one_line(run, tmp_path, bad, capsys):
    capsys.readouterr()
    assert main(["horizon", str(run), "--out", str(tmp_path), *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and bad[0] in err[0]
    assert not (tmp_path / "horizon.csv").exists()


@pytest.mark.parametrize("name", ["horizon.csv", "horizon.json", "horizon.png", "horizon_maze.png"])
def test_a_file_of_the_users_is_kept_and_refused_before_the_sweep(run, tmp_path, name, capsys, monkeypatch):
    import recurvit.analysis.mazes as mazes

    (tmp_path / name).write_text("my notes\n")
    swept = []
    monkeypatch.setattr(mazes, "maze_sweep_sizes", lambda *a, **k: swept.append(1))
    capsys.readouterr()
    assert main(["horizon", str(run), "--steps", "3", "--sizes", "9", "--mazes", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name} exists and was not written by this command" in err[0]
    assert (tmp_path / name).read_text() == "my notes\n" and not swept
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_second_sweep_writes_over_the_first(run, tmp_path, capsys):  # what it writes is recognised as its own
    argv = ["horizon", str(run), "--steps", "3", "--sizes", "9", "--mazes", "2", "--out", str(tmp_path), "--json"]
    assert main(argv) == 0 and main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["horizon.csv", "horizon.json", "horizon.png",
                                                          "horizon_maze.png"]


def test_a_stack_models_sweep_stops_at_its_depth_and_says_so(tmp_path, capsys):
    run = tmp_path / "stack"
    assert main(["train", *TINY, "model.core=stack", "model.depth=2", "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["horizon", str(run), "--sizes", "9", "--mazes", "2", "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["max_steps"] == 2 and "K capped" in summary["note"]



def _maze_png(path, size=9, seed=0):
    from PIL import Image

    from recurvit.data.mazes import make_mazes

    x, _ = make_mazes(1, size, seed, "test")
    Image.fromarray(x[0].transpose(1, 2, 0)).save(path)


def test_predict_refuses_what_it_cannot_write_before_writing_any(run, tmp_path, capsys):
    (tmp_path / "two").mkdir()
    _maze_png(tmp_path / "two" / "maze.png")
    _maze_png(tmp_path / "two" / "maze.bmp")  # both would write maze.path.png: one silently lost
    assert main(["predict", str(run), str(tmp_path / "two")]) == 2
    assert "would both write" in capsys.readouterr().err and not (tmp_path / "two" / "maze.path.png").exists()
    (tmp_path / "mine").mkdir()
    _maze_png(tmp_path / "mine" / "a.png")
    _maze_png(tmp_path / "mine" / "b.png", seed=1)
    (tmp_path / "mine" / "b.path.png").write_text("my notes")  # the user's: refused before a.path.png is written
    assert main(["predict", str(run), str(tmp_path / "mine" / "a.png"), str(tmp_path / "mine" / "b.png")]) == 2
    assert "b.path.png exists" in capsys.readouterr().err and not (tmp_path / "mine" / "a.path.png").exists()
    assert (tmp_path / "mine" / "b.path.png").read_text() == "my notes"
    assert main(["predict", str(run), str(tmp_path / "mine" / "a.png"), "--csv", str(tmp_path / "p.csv")]) == 2
    assert "--csv writes class rows" in capsys.readouterr().err and not (tmp_path / "p.csv").exists()


def test_a_maze_image_a_vit_cannot_read_is_one_line():
    from recurvit import create_model
    from recurvit.errors import UserError
    from recurvit.export.predict import check_dense_sides

    kw = dict(embed_dim=16, num_heads=2, patch_size=4, img_size=24, num_classes=2, dense=True, class_token=False,
              global_pool="avg", core="recurrent", steps=2)
    fixed, dynamic = create_model("bvit_tiny", **kw), create_model("bvit_tiny", dynamic_img_size=True, **kw)
    check_dense_sides(fixed, [("a", 24)])
    check_dense_sides(dynamic, [("a", 24), ("b", 32)])  # 13x13: 32 px
    with pytest.raises(UserError, match="b: a 30-pixel maze image, and this model reads 4-pixel patches"):
        check_dense_sides(dynamic, [("a", 24), ("b", 30)])  # a 30-pixel image is no maze: its mask would be 28
    with pytest.raises(UserError, match="runs only at 24 pixels"):
        check_dense_sides(fixed, [("b", 32)])


@pytest.mark.parametrize("args, says", [
    (["--sizes", "100001"], "one batch of 100001x100001 mazes takes about"),
    (["--mazes", "1000000000"], "1,000,000,000 mazes a size hold about"),
])
def test_a_sweep_too_large_for_the_machine_is_priced_before_any_maze_is_made(run, tmp_path, args, says, capsys,
                                                                             monkeypatch):
    """Issue 57, item 10: --sizes 100001 tried to allocate 18.6 GiB; --mazes 1e9 crashed after 75 s."""
    import recurvit.data.mazes as mazes

    monkeypatch.setattr(mazes, "make_mazes", lambda *a, **k: pytest.fail("mazes generated before pricing"))
    capsys.readouterr()
    assert main(["horizon", str(run), *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())
