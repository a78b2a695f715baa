"""A task defined outside the package, in this module alone: regressing a digit's value (0-9) from its image
with an MSE loss. It is added with one call (``task_table.add``), trained through the one loop, resumed
bit-identically, run as a two-cell study in spawned worker processes (which import this module by the path the
table hands them) and loaded with ``recurvit.load_model``; nothing in the package is edited for it.

What it defines (12 names): ``DigitValue`` with ``name``, ``reader``, ``setup``, ``start_epoch``, ``train_step``,
``evaluate``; ``DigitValueView`` with ``name``, ``CSV_KEYS``, ``STAT_KEYS``, ``run``.
"""
import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import recurvit
from recurvit import task_table
from recurvit.config import load_config
from recurvit.run.checkpoint import Reader, build_model_from_config, read_model
from recurvit.run.loaders import build_loaders, set_epoch
from recurvit.run.progress import quiet
from recurvit.study.registry import View
from recurvit.study.workers import run_config
from recurvit.tasks import Task
from recurvit.train.fit import fit
from recurvit.train.loop import Step
from recurvit.train.optim import build_optimizer, build_scheduler


class DigitValue(Task):
    """A digit image -> its value, one output trained with MSE; its checkpoints hold a RunConfig, so the
    registry's model rebuilds them (``read_model``)."""

    name = "digit_value"
    reader = Reader(read_model)

    def setup(self, env, device, log, force=False):
        self.train_loader, self.test_loader, info = build_loaders(self.cfg, env=env)
        self.cfg.model = replace(self.cfg.model, img_size=info.img_size, in_chans=info.in_chans, num_classes=1)
        self.device, self.model = device, build_model_from_config(self.cfg).to(device)
        self.opt = build_optimizer(self.model, self.cfg.train, device)
        self.steps_per_epoch = len(self.train_loader)
        self.sched = build_scheduler(self.opt, self.cfg.train, self.steps_per_epoch)

    def start_epoch(self, epoch):  # the loader's shuffle depends on (seed, epoch) only: a resume draws the same
        set_epoch(self.train_loader, self.cfg.train.seed * 100_003 + epoch)

    def train_step(self, batch, amp):
        x, y = batch[0].to(self.device), batch[1].to(self.device)
        with amp():
            loss = F.mse_loss(self.model(x).squeeze(-1).float(), y.float())
        return Step(loss, len(y), {"loss": loss.detach()})

    def evaluate(self, env):
        self.model.eval()
        with torch.no_grad():
            err = [(self.model(x.to(self.device)).squeeze(-1) - y.to(self.device)).pow(2) for x, y in self.test_loader]
        return {"test_mse": torch.cat(err).mean().item()}


class DigitValueView(View):
    """A study of DigitValue runs: test MSE per cell (the report's table and cells are the base's)."""

    name = "digit_value"
    CSV_KEYS = ["model", "embed_dim", "seed", "test_mse", "train_seconds"]
    STAT_KEYS = ["test_mse"]

    def run(self, base, overrides, out, eval_spec, nproc=1, threads=None):
        cfg = run_config(load_config, out, base, overrides)
        metrics = fit(DigitValue(cfg), out, resume=out.is_dir(), log=quiet)
        model = recurvit.load_model(out)  # the run as a user opens it, in the worker's own process
        return {"model": cfg.model.name, "embed_dim": model.cfg.embed_dim, "seed": cfg.train.seed,
                "test_mse": metrics["test_mse"], "train_seconds": metrics["train_seconds"], "pid": os.getpid()}


# ------------------------------------------------------------------------------------------------ the tests
BASE = """model: {name: bvit_tiny, embed_dim: 16, num_heads: 2, steps: 2, patch_size: 4}
data: {name: digits}
train: {epochs: 2, batch_size: 128, device: cpu, progress: false}
"""


@pytest.fixture
def added():
    task_table.add(DigitValue, view=DigitValueView)
    yield
    task_table.remove(DigitValue.name)


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.mark.slow
def test_an_outside_task_trains_resumes_bit_identically_and_loads(tmp_path, added):
    (tmp_path / "base.yaml").write_text(BASE)
    whole = fit(DigitValue(load_config(tmp_path / "base.yaml")), tmp_path / "whole", log=quiet)
    fit(DigitValue(load_config(tmp_path / "base.yaml")), tmp_path / "split", log=quiet, stop_after=1)
    again = fit(DigitValue(load_config(tmp_path / "split" / "config.yaml")), tmp_path / "split", resume=True,
                log=quiet)
    a, b = _weights(tmp_path / "whole" / "last.pt"), _weights(tmp_path / "split" / "last.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again["test_mse"] == whole["test_mse"] and whole["epoch"] == 2

    model = recurvit.load_model(tmp_path / "whole")
    assert model.head.out_features == 1 and all(torch.equal(v, a[k]) for k, v in model.state_dict().items())
    x = torch.rand(3, 1, 8, 8)
    assert model(x).shape == (3, 1)


@pytest.mark.slow
def test_an_outside_task_runs_a_two_cell_study_in_spawned_workers(tmp_path, added):
    from recurvit.study import load_study, run_study, write_report

    (tmp_path / "base.yaml").write_text(BASE.replace("epochs: 2", "epochs: 1"))
    (tmp_path / "s.yaml").write_text("name: toy\ntask: digit_value\nbase: base.yaml\n"
                                     "grid:\n  model.embed_dim: [8, 16]\nresults: results\n")
    study = load_study(tmp_path / "s.yaml")
    rows = run_study(study, tmp_path / "out", workers=2, progress=False, log=lambda *a: None)
    assert [r.get("error") for r in rows] == [None, None], rows
    assert [r["embed_dim"] for r in rows] == [8, 16] and all(r["test_mse"] > 0 for r in rows)
    assert os.getpid() not in {r["pid"] for r in rows}  # trained, evaluated and loaded in fresh processes
    report = write_report(rows, study, study.results).read_text()
    assert "| model.embed_dim | test_mse |" in report and "2 runs; seeds [0]" in report
    assert (study.results / "results.csv").read_text().splitlines()[0] == \
        "run_id,model.embed_dim,model,embed_dim,seed,test_mse,train_seconds"
    model = recurvit.load_model(tmp_path / "out" / "runs" / "embed_dim=16")  # here too, not only in a worker
    assert model.cfg.embed_dim == 16
