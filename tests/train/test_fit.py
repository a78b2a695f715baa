"""The one training loop (train/fit.py) with a task it has never seen: a new task is one class.

The task here (predict an image's mean intensity with a linear model) defines only what
``recurvit.tasks.base.Task`` asks for; resume, best.pt on its own score, the checkpoint schema and
the refusal to resume another task's run come from the loop."""
import dataclasses
import json

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import yaml

from recurvit.config import TrainConfig
from recurvit.errors import UserError
from recurvit.tasks.base import Task
from recurvit.train.fit import fit
from recurvit.train.loop import Step
from recurvit.train.optim import build_optimizer, build_scheduler


@dataclasses.dataclass
class BrightnessConfig:
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(epochs=4, batch_size=16, lr=0.05, warmup_epochs=0, weight_decay=0.0,
                                            progress=False, device="cpu"))


class Brightness(Task):
    """Images (64 values) -> their mean, by a linear model; best.pt on the validation error."""

    name = "brightness"

    def config_dict(self):
        return dataclasses.asdict(self.cfg)

    def config_yaml(self):
        return yaml.safe_dump(self.config_dict())

    def setup(self, env, device, log, force=False):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(96, 64, generator=g)
        self.val = torch.rand(32, 64, generator=g)
        self.model = nn.Linear(64, 1)  # initialised from the seed the loop set
        self.device = device
        # shuffled from the global RNG, which the loop restores on resume
        self.train_loader = DataLoader(TensorDataset(self.x), batch_size=16, shuffle=True)
        self.steps_per_epoch = len(self.x) // self.cfg.train.batch_size
        self.opt = build_optimizer(self.model, self.cfg.train, device)
        self.sched = build_scheduler(self.opt, self.cfg.train, self.steps_per_epoch)

    def _mse(self, x):
        return (self.model(x).squeeze(1) - x.mean(1)).pow(2).mean()

    def train_step(self, batch, amp):
        (x,) = batch
        loss = self._mse(x)
        return Step(loss, len(x), {"loss": loss.detach()})

    def epoch_metrics(self, totals, seconds):
        return {"lr": self.sched.get_last_lr()[0], "train_mse": totals.mean("loss"), "seconds": 0.0}

    def evaluate(self, env):
        with torch.no_grad():
            return {"val_mse": self._mse(self.val).item()}

    def score(self, metrics, last):
        return -metrics["val_mse"]


def _rows(run):
    return [{k: v for k, v in json.loads(ln).items() if k != "train_cpu_seconds"}
            for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_new_task_trains_resumes_and_keeps_its_best_through_the_one_loop(tmp_path):
    quiet = dict(log=lambda *a: None)
    whole = fit(Brightness(BrightnessConfig()), tmp_path / "whole", **quiet)
    fit(Brightness(BrightnessConfig()), tmp_path / "part", stop_after=2, **quiet)
    assert [r["epoch"] for r in _rows(tmp_path / "part")] == [1, 2]
    resumed = fit(Brightness(BrightnessConfig()), tmp_path / "part", resume=True, **quiet)
    assert _rows(tmp_path / "part") == _rows(tmp_path / "whole")  # a resume changes nothing
    assert resumed["val_mse"] == whole["val_mse"] and whole["val_mse"] < _rows(tmp_path / "whole")[0]["val_mse"]
    best = torch.load(tmp_path / "whole" / "best.pt", weights_only=True)
    last = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)
    vals = [r["val_mse"] for r in _rows(tmp_path / "whole")]
    assert best["epoch"] == 1 + vals.index(min(vals))  # best.pt: the task's own score
    assert best["task"] == last["task"] == "brightness" and last["epoch"] == 4
    assert {"format", "config", "model", "optimizer", "scheduler", "rng", "metrics", "best_score"} <= set(last)
    assert yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())["train"]["epochs"] == 4


def test_the_loop_refuses_to_resume_another_tasks_run(tmp_path):
    from recurvit.config import load_config
    from recurvit.tasks.classify.task import ClassifyTask

    fit(Brightness(BrightnessConfig()), tmp_path / "run", stop_after=1, log=lambda *a: None)
    with pytest.raises(UserError, match="it is a brightness run, not a classify run") as e:
        fit(ClassifyTask(load_config(None, ["train.epochs=2"])), tmp_path / "run", resume=True, log=lambda *a: None)
    assert "\n" not in str(e.value)
    assert [r["epoch"] for r in _rows(tmp_path / "run")] == [1]  # the run is left as it was


# ------------------------------------------------------------------ the batch loop (train/loop.py)
class TwoRanks:
    """A process group of two ranks that saw the same batch: every sum doubles."""

    enabled, is_main, world_size, rank = True, True, 2, 0

    def all_reduce_sum(self, values, device):
        return [2 * float(v) for v in values]


def test_the_loops_sums_are_means_over_every_image_and_global_under_ddp():
    from recurvit.run import distributed as dist_io
    from recurvit.train.loop import Totals

    step = Step(torch.tensor(0.5), 4, {"loss": torch.tensor(0.5), "stages": torch.tensor([1.0, 2.0])},
                {"correct": torch.tensor(3)})
    late = Step(torch.tensor(0.25), 2, {"loss": torch.tensor(0.25), "stages": torch.tensor([4.0, 6.0, 8.0])})
    one, two = Totals(), Totals()
    for t, env in ((one, dist_io.SINGLE), (two, TwoRanks())):
        assert t.add(step, env, torch.device("cpu")) == 0.5  # the step's mean loss, what divergence reads
        assert t.add(late, env, torch.device("cpu")) == 0.25
    # the loss over every image (4 x 0.5 + 2 x 0.25) / 6; a readout only the second step had: its images only
    assert one.mean("loss") == two.mean("loss") == pytest.approx(2.5 / 6)
    assert one.means("stages") == two.means("stages") == pytest.approx([(4 + 8) / 6, (8 + 12) / 6, 8.0])
    assert (one.n, one.total("correct")) == (6, 3) and (two.n, two.total("correct")) == (12, 6)


class Steps(Brightness):
    """Brightness, with a second step after each optimizer step and a loss that can be made to diverge."""

    after_calls = 0
    diverge_at = None

    def train_step(self, batch, amp):
        step = super().train_step(batch, amp)
        loss = step.loss * float("nan") if self.after_calls == self.diverge_at else step.loss
        step.loss, step.means["loss"] = loss, loss.detach()

        def after():
            self.after_calls += 1
            return {"aux": 1.0}

        step.after = after
        return step

    def epoch_metrics(self, totals, seconds):
        return {**super().epoch_metrics(totals, seconds), "aux": totals.mean("aux"), "n": totals.n}


def test_the_loop_runs_a_steps_after_hook_after_the_update_and_stops_on_divergence(tmp_path):
    task = Steps(BrightnessConfig())
    fit(task, tmp_path / "ok", stop_after=1, log=lambda *a: None)
    (row,) = _rows(tmp_path / "ok")
    assert task.after_calls == 6 and row["aux"] == 1.0 and row["n"] == 96  # every batch, weighted by its images
    bad = Steps(BrightnessConfig())
    bad.diverge_at = 2
    with pytest.raises(UserError, match=r"diverged \(loss=nan\) at epoch 1"):
        fit(bad, tmp_path / "bad", log=lambda *a: None)
    assert bad.after_calls == 2  # stopped before the diverged step's update
