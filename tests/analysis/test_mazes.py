"""analysis/mazes.py: solved after every iteration at every size in one pass, and the two per-input
rules (DeepThinking's maximal confidence; stop when the prediction stops changing)."""
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from recurvit.analysis.mazes import maze_sweep, maze_sweep_sizes, plot_solved, summarize_mazes
from recurvit.config import load_config
from recurvit.data.mazes import maze_test_sets
from recurvit.models import create_model
from recurvit.tasks.dense.task import evaluate_dense


class Scripted(nn.Module):
    """A 'model' whose readout after step k is logits[k - 1] (K, B, C, H, W): the rules on a known sequence."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.norm = nn.Identity()

    def iter_states(self, x, steps):  # the state after step k: k in every image's two entries
        return (torch.full((len(x), 2), float(k)) for k in range(1, steps + 1))

    def forward_head(self, z, step):
        return self.logits[step - 1]


def _seq(preds, scale):
    """Logits (K, B, 2, 1, 2) predicting class preds[k][b] at every pixel with margin scale[k][b]."""
    p = torch.tensor(preds, dtype=torch.float)[..., None, None, None]  # (K, B, 1, 1, 1)
    s = torch.tensor(scale, dtype=torch.float)[..., None, None, None]
    one = torch.cat([-(2 * p - 1), 2 * p - 1], dim=2) * s  # (K, B, 2, 1, 1)
    return one.expand(-1, -1, -1, 1, 2).contiguous()


def test_the_rules_on_a_known_sequence():
    # image 0 predicts 0, 1, 1, 1; image 1 predicts 0, 0, 1, 1; the target is all 1
    logits = _seq([[0, 0], [1, 0], [1, 1], [1, 1]], [[1, 1], [1, 3], [5, 1], [5, 2]])
    data = [(torch.zeros(2, 1, 1, 2), torch.ones(2, 1, 2, dtype=torch.long))]
    sw = maze_sweep(Scripted(logits), data, torch.device("cpu"), max_steps=4)
    assert sw["solved"] == [0.0, 0.5, 1.0, 1.0] and sw["accuracy"] == [0.0, 0.5, 1.0, 1.0]
    assert sw["stable"]["steps"] == [3, 2] and sw["stable"]["solved"] == 0.5  # image 1 stops at its empty mask
    assert sw["max_conf"]["steps"] == [3, 2] and sw["max_conf"]["solved"] == 0.5  # first of the ties; image 1: 3 > 2
    later = maze_sweep(Scripted(logits), data, torch.device("cpu"), max_steps=4, min_steps=3)
    assert later["stable"]["steps"] == [3, 4] and later["stable"]["solved"] == 1.0
    assert maze_sweep(Scripted(logits), data, torch.device("cpu"), 4, patience=2)["stable"]["steps"] == [4, 4]


class Batches(Scripted):
    """A scripted model whose n-th batch reads out logits[n] (each (K, B, C, H, W)), for several batches."""

    def __init__(self, *logits):
        super().__init__(None)
        self.all, self.batch = logits, -1

    def iter_states(self, x, steps):
        self.batch += 1
        self.logits = self.all[self.batch]
        return super().iter_states(x, steps)


def _batch(n, value):
    """n maze images of one value each (value, value + 0.1, ...) and an all-path target."""
    x = torch.stack([torch.full((3, 1, 2), value + 0.1 * i) for i in range(n)])
    return x, torch.ones(n, 1, 2, dtype=torch.long)


def test_the_example_is_the_first_maze_the_stable_rule_solves_with_its_masks():
    # (min_steps 2, patience 1) batch 1: image 0 predicts 1, 0, 1, 0 (never stable: read at K, not solved),
    # image 1 predicts 0 throughout (stops at 2 on its empty mask). Batch 2: image 0 predicts 0, 0, 1, 1 (stops
    # at 2, not solved), image 1 predicts 0, 1, 1, 0 (stops at 3, solved; at K it has erased the path). Batch 3:
    # image 0 predicts 1 throughout (solved, stops at 2): a later solved maze, not the first
    seqs = (_seq([[1, 0], [0, 0], [1, 0], [0, 0]], [[1, 1]] * 4), _seq([[0, 0], [0, 1], [1, 1], [1, 0]], [[1, 1]] * 4),
            _seq([[1], [1], [1], [1]], [[1]] * 4))
    data = [_batch(2, 0.1), _batch(2, 0.3), _batch(1, 0.5)]
    sw = maze_sweep(Batches(*seqs), data, torch.device("cpu"), max_steps=4, min_steps=2, example=True)
    ex = sw["example"]
    assert sw["stable"]["steps"] == [4, 2, 2, 3, 2]
    assert ex["solved"] and ex["stopped"] and ex["step"] == 3 and not ex["solved_last"]  # batch 2's image 1
    assert ex["stop"].tolist() == [[1, 1]] and ex["last"].tolist() == [[0, 0]] and ex["target"].tolist() == [[1, 1]]
    assert ex["image"].shape == (3, 1, 2) and ex["image"].dtype == torch.uint8
    assert int(ex["image"][0, 0, 0]) == round(0.4 * 255)
    assert "example" not in maze_sweep(Batches(*seqs), data, torch.device("cpu"), max_steps=4)


def test_with_none_solved_the_example_is_the_first_maze_read_where_the_rule_read_it():
    # image 0 predicts 0, 1, 0: never stable (from 2, patience 1), read at K = 3, not solved; image 1 stops at 2
    seq = _seq([[0, 0], [1, 0], [0, 0]], [[1, 1]] * 3)
    ex = maze_sweep(Batches(seq), [_batch(2, 0.1)], torch.device("cpu"), max_steps=3, min_steps=2,
                    example=True)["example"]
    assert not ex["solved"] and not ex["stopped"] and ex["step"] == 3
    assert ex["stop"].tolist() == [[0, 0]] == ex["last"].tolist()  # its mask at K, not at the first stop in the batch
    assert int(ex["image"][0, 0, 0]) == round(0.1 * 255)
    later = maze_sweep(Batches(seq, seq), [_batch(2, 0.1), _batch(2, 0.5)], torch.device("cpu"), max_steps=3,
                       min_steps=2, example=True)["example"]
    assert int(later["image"][0, 0, 0]) == round(0.1 * 255)  # a second batch with none solved keeps the first maze
    one = maze_sweep(Batches(_seq([[0]], [[1]])), [_batch(1, 0.1)], torch.device("cpu"), max_steps=1,
                     example=True)["example"]  # K = 1: nothing can stop; read at 1
    assert one["step"] == 1 and not one["stopped"] and one["stop"].tolist() == [[0, 0]]


def test_one_pass_gives_every_iteration_at_every_size(tmp_path):
    torch.manual_seed(0)
    model = create_model("dt_net_recall", width=8, steps=3)
    cfg = load_config(None, ["data.name=mazes", "data.maze_test=6", "data.maze_test_sizes=[9,13]",
                             "data.maze_train=8", "data.maze_val=4"])
    sets = maze_test_sets(cfg.data)
    sweeps = maze_sweep_sizes(model, sets, torch.device("cpu"), max_steps=6, batch_size=4)
    assert sorted(sweeps) == [9, 13]
    for size, sw in sweeps.items():
        assert sw["step"] == list(range(1, 7)) and sw["n"] == 6
        for k in (1, 3, 6):  # the one-pass figures are the model's own at k steps
            ev = evaluate_dense(model, DataLoader(sets[size], batch_size=4), torch.device("cpu"), steps=k, amp="off")
            assert sw["accuracy"][k - 1] == pytest.approx(ev["accuracy"]) and sw["solved"][k - 1] == ev["solved"]
        assert all(1 <= s <= 6 for s in sw["max_conf"]["steps"] + sw["stable"]["steps"])
    rows = summarize_mazes(sweeps, trained=3)
    assert [r["size"] for r in rows] == [9, 13] and rows[0]["solved_2T"] == sweeps[9]["solved"][5]
    assert rows[0]["solved_4T"] is None and rows[0]["drop_10T"] is None
    plot_solved(sweeps, 3, tmp_path / "solved.png")
    assert (tmp_path / "solved.png").stat().st_size > 0


@pytest.mark.slow
def test_a_trained_run_is_swept_from_its_directory(tmp_path):
    from recurvit.analysis.mazes import sweep_run
    from recurvit.tasks.classify.task import train

    train(load_config(None, ["data.name=mazes", "data.maze_train=32", "data.maze_val=8", "data.maze_test=4",
                             "data.maze_test_sizes=[9,13]", "model.name=dt_net_recall", "model.width=8", "model.steps=2",
                             "train.epochs=1", "train.batch_size=16", "train.progress=false", "train.device=cpu"]),
          tmp_path / "run", log=lambda *a: None)
    res = sweep_run(tmp_path / "run", factor=3, sizes=[9, 17], n=3, out=tmp_path / "sweep")
    assert res["trained_steps"] == 2 and sorted(res["sweeps"]) == [9, 17]
    assert res["sweeps"][17]["n"] == 3 and len(res["sweeps"][17]["solved"]) == 6
    assert (tmp_path / "sweep" / "sweeps.json").is_file() and (tmp_path / "sweep" / "solved.png").is_file()


def test_path_recall_and_precision_say_how_the_path_is_wrong():
    # one image of 2 pixels, the path on pixel 1 only; step 1: nothing marked, step 2: both (a spill into a dead
    # end), step 3: the path alone, step 4: pixel 0 alone (the path eroded, a wrong one marked)
    preds = torch.tensor([[0, 0], [1, 1], [0, 1], [1, 0]], dtype=torch.float)  # (K, pixels)
    logits = torch.stack([-(2 * preds - 1), 2 * preds - 1], dim=1)[:, None, :, None, :]  # (K, B=1, 2, 1, 2)
    data = [(torch.zeros(1, 1, 1, 2), torch.tensor([[[0, 1]]]))]
    sw = maze_sweep(Scripted(logits), data, torch.device("cpu"), max_steps=4)
    assert sw["path_recall"] == [0.0, 1.0, 1.0, 0.0]
    assert sw["path_precision"] == [None, 0.5, 1.0, 0.0]  # nothing marked: no precision to speak of
    assert sw["solved"] == [0.0, 0.0, 1.0, 0.0]


def test_the_state_figures_are_each_images_rms_and_relative_step():
    # the state after step k is k everywhere (Scripted): RMS k, and a step of 1 against a state of k
    logits = _seq([[0, 0], [1, 0], [1, 1], [1, 1]], [[1, 1]] * 4)
    data = [(torch.zeros(2, 1, 1, 2), torch.ones(2, 1, 2, dtype=torch.long))]
    sw = maze_sweep(Scripted(logits), data, torch.device("cpu"), max_steps=4)
    assert sw["state_rms"] == [1.0, 2.0, 3.0, 4.0] and sw["state_change"][0] is None
    assert sw["state_change"][1:] == pytest.approx([1 / 2, 1 / 3, 1 / 4], rel=1e-6)  # float32 states
    row = summarize_mazes({9: sw}, trained=2)[0]
    assert (row["state_rms_T"], row["state_change_T"], row["state_rms_10T"]) == (2.0, 0.5, None)


def test_the_state_figures_do_not_depend_on_the_batching():
    torch.manual_seed(0)
    model = create_model("dt_net_recall", width=8, steps=3)
    cfg = load_config(None, ["data.name=mazes", "data.maze_test=6", "data.maze_test_sizes=[9]",
                             "data.maze_train=8", "data.maze_val=4"])
    data = maze_test_sets(cfg.data)[9]
    one = maze_sweep(model, DataLoader(data, batch_size=6), torch.device("cpu"), max_steps=4)
    split = maze_sweep(model, DataLoader(data, batch_size=4), torch.device("cpu"), max_steps=4)
    x = torch.stack([data[i][0] for i in range(6)])
    states = [z.flatten(1) for z in model.iter_states(x, 4)]
    assert one["state_rms"] == pytest.approx([float(z.pow(2).mean(1).sqrt().mean()) for z in states], rel=1e-6)
    assert one["state_rms"] == pytest.approx(split["state_rms"], rel=1e-6)
    assert one["state_change"][1:] == pytest.approx(split["state_change"][1:], rel=1e-6)


def test_deepthinkings_max_conf_counts_only_the_open_pixels():
    # pixel 0 is a wall (black), pixel 1 open; the path is pixel 1. Step 1: sure of the wall, unsure of the
    # path (solved); step 2: unsure of the wall, sure of the wrong class on the open pixel (not solved)
    logits = torch.tensor([[[5.0, -0.1], [-5.0, 0.1]], [[0.05, 1.5], [-0.05, -1.5]]])  # (K, C, W)
    logits = logits[:, None, :, None, :]  # (K, B=1, C=2, H=1, W=2)
    x = torch.tensor([[[[0.0, 1.0]]] * 3])  # (1, 3, 1, 2)
    sw = maze_sweep(Scripted(logits), [(x, torch.tensor([[[0, 1]]]))], torch.device("cpu"), max_steps=2)
    assert sw["solved"] == [1.0, 0.0]
    assert sw["max_conf"]["steps"] == [1] and sw["max_conf"]["solved"] == 1.0  # every pixel: 0.775 > 0.739
    assert sw["max_conf_open"]["steps"] == [2] and sw["max_conf_open"]["solved"] == 0.0  # open: 0.953 > 0.550


def test_deepthinkings_solved_in_the_sweep_forgives_walls_and_nothing_else():
    # one image of two pixels: the first a wall (black), the second open; the target is (0, 1)
    x = torch.zeros(1, 3, 1, 2)
    x[0, :, 0, 1] = 1.0
    y = torch.tensor([[[0, 1]]])
    # step 1 predicts (1, 1): only the wall is wrong; step 2 predicts (0, 0): the open pixel is wrong
    logits = torch.zeros(2, 1, 2, 1, 2)
    logits[0, :, 1] = 1.0
    logits[1, :, 0] = 1.0
    sw = maze_sweep(Scripted(logits), [(x, y)], torch.device("cpu"), max_steps=2)
    assert sw["solved"] == [0.0, 0.0] and sw["solved_open"] == [1.0, 0.0]
    assert summarize_mazes({9: sw}, trained=1)[0]["solved_open_T"] == 1.0


def test_plot_solved_dots_deepthinkings_solved_only_where_it_differs_from_the_strict_one(tmp_path):
    from matplotlib.figure import Figure

    def dotted(sweeps):
        ax = Figure().add_subplot()
        plot_solved(sweeps, 2, tmp_path / "unused.png", ax=ax)
        return [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and len(ln.get_xdata())]

    same = {9: {"step": [1, 2, 4], "solved": [0.1, 0.5, 0.9], "solved_open": [0.1, 0.5, 0.9]}}
    assert dotted(same) == []
    differs = {9: {"step": [1, 2, 4], "solved": [0.0, 0.0, 0.0], "solved_open": [0.06, 0.0, 0.0]}, 13: same[9]}
    lines = dotted(differs)
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [0.06, 0.0, 0.0]
