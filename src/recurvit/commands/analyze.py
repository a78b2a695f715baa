"""recurvit analyze RUN_DIR [--what readout,norms,attention,cka,pruning] [--num-images N] [--out DIR] [--json]"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from . import DeprecatedOption, add_device_arg, add_force_arg, open_trained, print_json


def add_parser(sub):
    p = sub.add_parser(
        "analyze", help="look inside a trained model step by step: readouts, attention, CKA, step-specific pruning",
        description="Writes CSVs and PNGs into DIR (default RUN_DIR/analysis): steps.csv/png (readout accuracy, "
                    "token-state norm, relative update per step), attention.csv/png (entropy and mean attention "
                    "distance per step and head), cka_tokens.csv / cka_pooled.csv / cka.png (linear CKA between "
                    "every pair of steps; 'emb' = the embedding), pruning_heads.csv / pruning_mlp.csv / "
                    "pruning_skip.csv / pruning.png (accuracy drop when one head, one MLP hidden slice, or the "
                    "whole block is masked at ONE step; with it, the fixed-point control: the accuracy lost when "
                    "the last step's update is replaced by the previous update continued, and the split-half "
                    "correlation of the map's step-specific part, even against odd images), summary.json. A stack "
                    "ViT is analysed layer by layer.")
    p.add_argument("run", type=Path, help="run directory or checkpoint (finetuned runs included)")
    p.add_argument("--what", default="readout,norms,attention,cka,pruning",
                   help="comma-separated subset of readout,norms,attention,cka,pruning (default: all)")
    p.add_argument("--num-images", type=int, default=512, help="test images used (a fixed random subset; default 512)")
    p.add_argument("--images", dest="num_images", type=int, action=DeprecatedOption, new="--num-images")
    p.add_argument("--steps", type=int, help="steps to run (default: the trained depth)")
    p.add_argument("--mlp-slices", type=int, help="MLP hidden units cut into this many slices (default: heads)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default 256)")
    p.add_argument("--out", type=Path, help="output directory (default RUN_DIR/analysis)")
    p.add_argument("--data-root", help="override data.root (data moved since training)")
    add_device_arg(p)
    add_force_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def run(args) -> int:
    import torch

    from ..analysis.budget import check_eval_cost
    from ..analysis.per_step import ANALYSES, analyze_model, continuation
    from ..analysis.per_step_report import summarize, write_outputs
    from ..run.outputs import write_text

    what = [w.strip() for w in args.what.split(",") if w.strip()]
    bad = [w for w in what if w not in ANALYSES]
    if bad or not what:
        raise UserError(f"--what takes a comma-separated subset of {','.join(ANALYSES)}; got '{args.what}'")
    if args.num_images < 1:
        raise UserError(f"--num-images must be >= 1, got {args.num_images}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    model, cfg, device, test_loader, _ = open_trained(args)
    if args.steps is not None:
        try:
            model.core.check_steps(args.steps)
        except ValueError as e:
            raise UserError(f"--steps: {e}") from None
    if args.mlp_slices is not None and not 1 <= args.mlp_slices <= model.blocks[0].mlp.fc1.out_features:
        raise UserError(f"--mlp-slices must be in 1..{model.blocks[0].mlp.fc1.out_features}, got {args.mlp_slices}")
    test_set = test_loader.dataset
    n = min(args.num_images, len(test_set))
    idx = torch.randperm(len(test_set), generator=torch.Generator().manual_seed(0))[:n].sort().values
    items = [test_set[int(i)] for i in idx]
    xs = torch.stack([x for x, _ in items])
    ys = torch.tensor([y for _, y in items])
    batches = [(xs[i:i + args.batch_size], ys[i:i + args.batch_size]) for i in range(0, n, args.batch_size)]
    K = model.core.check_steps(args.steps)
    # one pass of K steps, plus (pruning) one per step and masked unit (heads, MLP slices, the whole block)
    # and one for the fixed-point control
    heads, slices = model.blocks[0].attn.num_heads, args.mlp_slices or model.blocks[0].attn.num_heads
    passes = 1 + (K * (heads + slices + 1) + 1 if "pruning" in what else 0)
    check_eval_cost(model, batches[0][0].to(device), K, len(batches) * passes, keeps_states=True, force=args.force)
    res = analyze_model(model, batches, what, steps=args.steps, mlp_slices=args.mlp_slices, device=device,
                        progress=not args.json)
    if "pruning" in what and K >= 2:  # the fixed-point control: the last update continued from the previous one
        res["pruning"]["continuation"] = continuation(model, batches, steps=K, device=device)
    out = args.out or ((args.run if args.run.is_dir() else args.run.parent) / "analysis")
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)}, {res['meta']['steps']} steps) on {cfg.data.name}, {n} test images"
    files = write_outputs(res, out, title=label)
    summary = {"run": str(args.run), "model": cfg.model.name, **summarize(res), "images": n,
               "calls_per_step": res["meta"]["calls_per_step"], "out": str(out)}
    # atomically, and only over a summary.json of analyze's (never through a link planted in the run folder)
    write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n", b'{\n  "run": ', "summary")
    files.append(str(out / "summary.json"))
    if args.json:
        print_json({**summary, "files": files})
        return 0
    print(label)
    if "acc_per_step" in summary:
        print(f"  readout accuracy per step: {' '.join(f'{a:.3f}' for a in summary['acc_per_step'])}")
    if "rel_update" in summary:
        print(f"  relative update per step:  {' '.join(f'{a:.3f}' for a in summary['rel_update'])}")
    if "attn_distance_per_step" in summary:
        print(f"  attention distance (patches, mean over heads): "
              f"{' '.join(f'{a:.2f}' for a in summary['attn_distance_per_step'])}")
    if "cka_tokens" in summary:
        c = summary["cka_tokens"]
        print(f"  CKA between steps (tokens): mean off-diagonal {c['mean_offdiag']:.3f}, min {c['min']:.3f}, "
              f"adjacent {c['adjacent_mean']:.3f}, first vs last {c['first_last']:.3f}")
    if "heads_top" in summary:
        t = summary["heads_top"]
        print(f"  pruning: base acc {summary['base_acc']:.3f}; worst head mask: step {t['step']} head {t['head']} "
              f"(-{t['drop']:.3f}); worst MLP slice: step {summary['mlp_top']['step']} slice "
              f"{summary['mlp_top']['slice']} (-{summary['mlp_top']['drop']:.3f}); skip drops "
              f"{' '.join(f'{d:.3f}' for d in summary['skip_drop'])}")
    if summary.get("split_half_r") is not None:
        print(f"  step-specific pruning map, split-half correlation (even vs odd images; ~0: the same units "
              f"in the same proportions at every step): {summary['split_half_r']:+.3f}")
    if "continue_drop" in summary:
        print(f"  last step continued from the previous one (fixed-point control): -{summary['continue_drop']:.3f}")
    print(f"  wrote {len(files)} files to {out}")
    return 0
