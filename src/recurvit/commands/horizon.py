"""recurvit horizon RUN_DIR [--steps K] [--json]; a maze run: [--sizes S ...] [--mazes N]"""
from __future__ import annotations

from pathlib import Path

from . import DeprecatedOption, add_device_arg, add_force_arg, print_json


def add_parser(sub):
    p = sub.add_parser("horizon", help="accuracy at every step up to K, beyond the training depth",
                       description="Writes horizon.csv (step, accuracy, loss, rel_change) and horizon.png into the "
                                   "run directory, in one pass of K block applications, and reports accuracy at "
                                   "T, 2T, 4T, 8T and 16T, the mean over T..4T and the data set's chance level. "
                                   "A maze run (model.dense): the share of mazes solved after every iteration up to "
                                   "K (default 10T) at every test size, in one pass a batch, written as "
                                   "horizon.csv / horizon.png / horizon.json, with solved at T, 2T, 4T, 10T a size "
                                   "and the two stopping rules (max confidence, a stable mask), and how the path is "
                                   "wrong (path recall: eroded past the answer; precision: spilled into dead ends).")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("--steps", type=int, metavar="K",
                   help="steps to sweep (default 16T, 10T for a maze run; a stack or SoftMoR model stops at "
                        "its depth)")
    p.add_argument("--max-steps", dest="steps", type=int, action=DeprecatedOption, new="--steps")
    p.add_argument("--out", type=Path, help="directory for horizon.csv / horizon.png (default: the run directory)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="S",
                   help="maze run: the maze sizes to test (default: the run's data.maze_test_sizes)")
    p.add_argument("--mazes", type=int, metavar="N",
                   help="maze run: test mazes a size (default: 200)")
    p.add_argument("--min-steps", type=int, metavar="M",
                   help="maze run: the stable rule's first possible stop (default: the trained depth T)")
    p.add_argument("--patience", type=int, metavar="P",
                   help="maze run: iterations the predicted path must stay unchanged for the stable rule to stop "
                        "(default 3, as the study evaluator)")
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_force_arg(p)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary and the sweep as JSON")
    return p


def run(args) -> int:
    from ..analysis.horizon_run import horizon_run

    res = horizon_run(args.run, args.steps, args.out, sizes=args.sizes, mazes=args.mazes, min_steps=args.min_steps,
                      patience=args.patience, data_root=args.data_root, device=args.device, force=args.force,
                      progress=not args.json)
    if args.json:
        print_json(res.summary)
    else:
        for line in res.lines:
            print(line)
    return 0
