"""recurvit vae train|eval|intervene|profile: the LoopVAE tokenizer.

    recurvit vae train [CONFIG.yaml] [key=value ...] [--out DIR] | --resume RUN_DIR [key=value ...]
    recurvit vae eval RUN [--loops 2,2,3] [--lpips-weights F --vgg-weights F] [--inception-weights F] [--json]
    recurvit vae intervene RUN [--truncate 1,2] [--extra 1,2,4] [--factors 0,0.5,0.9,1.1,2] [--json]
    recurvit vae profile [CONFIG.yaml] [key=value ...] [--operators conv,transformer] [--out CSV] [--json]
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import DeprecatedOption, add_device_arg, deprecated, add_force_arg, config_and_overrides, launch_processes, load_run_config, print_json


def _ints(text: str, what: str, minimum: int = 0):
    try:
        vals = [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < minimum:
        raise UserError(f"{what} must be integers >= {minimum}, got '{text}'")
    return vals


def _floats(text: str, what: str):
    try:
        return [float(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise UserError(f"{what} must be comma-separated numbers, got '{text}'") from None


def _loops(text, what):
    """'3' -> 3 (every scale), '2,2,3' -> [2, 2, 3]."""
    if text is None:
        return None
    vals = _ints(text, what)
    return vals[0] if len(vals) == 1 else vals


def add_parser(sub):
    p = sub.add_parser("vae", help="LoopVAE tokenizer: train, eval, intervene, profile",
                       description="LoopVAE: a VAE whose encoder and decoder each reuse one loop- and "
                                   "scale-conditioned core. With no config: configs/vae/photos.yaml (crops of "
                                   "scikit-learn's sample photographs).")
    vs = p.add_subparsers(dest="vae_command", metavar="SUBCOMMAND", parser_class=type(p))

    t = vs.add_parser("train", help="train a LoopVAE (default: the embedded photographs config)",
                      description="Trains a LoopVAE (or its unshared reference) into a run directory: config.yaml, "
                                  "metrics.jsonl (train loss, test PSNR / SSIM, the mean-image baseline), last.pt. "
                                  "No best.pt: the run has no validation split, so evaluation reads the last epoch. "
                                  "--resume RUN continues a run; --nproc N trains data-parallel under torchrun.")
    t.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]",
                   help="optional YAML config, then dotted overrides such as train.epochs=5 model.name=vae_unshared")
    t.add_argument("--out", type=Path, help="run directory (default runs/<data>-<model>-<time>)")
    t.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its last.pt")
    t.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    t.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train data-parallel in N processes (launches torchrun --standalone --nproc_per_node N); "
                        "train.batch_size is the global batch")

    e = vs.add_parser("eval", help="PSNR / SSIM (LPIPS / rFID with local weights) and a reconstruction grid",
                      description="Reconstructs the run's test split with the posterior mean and reports PSNR, "
                                  "SSIM, L1 and KL (LPIPS and rFID when their weight files are given, nothing is "
                                  "downloaded) against the mean-image baseline; writes recon_grid.png.")
    e.add_argument("run", type=Path, help="VAE run directory or checkpoint")
    _run_opts(e)
    e.add_argument("--lpips-weights", help="LPIPS linear layers (the lpips package's weights/v0.1/vgg.pth)")
    e.add_argument("--vgg-weights", help="torchvision VGG16 weights for LPIPS (vgg16-397923af.pth)")
    e.add_argument("--inception-weights", help="torchvision Inception-v3 weights for rFID (inception_v3_google-0cc3c7bd.pth)")
    e.add_argument("--lpips", action="store_true", help="compute LPIPS (needs --lpips-weights and --vgg-weights)")
    e.add_argument("--rfid", action="store_true", help="compute rFID (needs --inception-weights)")
    e.add_argument("--grid", type=Path, help="PNG of originals over reconstructions (default RUN/recon_grid.png)")
    e.add_argument("--json", action="store_true", help="print the result as JSON")

    i = vs.add_parser("intervene", help="loop interventions: fewer / extra loops, one loop's update scaled",
                      description="Re-runs a trained LoopVAE with its recurrence changed at test time: loops "
                                  "removed (--truncate) or added (--extra) at every scale, or one loop's update "
                                  "h <- h + f * (core(h) - h) scaled by each --factors value; one PSNR / SSIM row "
                                  "each in intervene.csv and intervene.png.")
    i.add_argument("run", type=Path, help="VAE run directory or checkpoint")
    i.add_argument("--truncate", default="1,2", help="loops removed at every scale, one row each (default 1,2)")
    i.add_argument("--extra", default="1,2,4", help="loops added at every scale, one row each (default 1,2,4)")
    i.add_argument("--factors", default="0,0.5,0.9,1.1,2", help="factors on one loop's update (default 0,0.5,0.9,1.1,2)")
    i.add_argument("--loop", type=int, help="which loop to scale (default: each scale's last trained loop)")
    i.add_argument("--sides", default="encoder,decoder", help="sides whose loop updates are scaled")
    i.add_argument("--out", type=Path, help="directory for intervene.csv / intervene.png (default: the run directory)")
    _run_opts(i, loops=False)
    i.add_argument("--json", action="store_true", help="print the result as JSON")

    f = vs.add_parser("profile", help="stored params vs time per image and FLOPs: LoopVAE vs unshared reference",
                      description="For each operator, builds the LoopVAE of a config and its unshared reference "
                                  "(the same execution graph with a block per application) and times them side by "
                                  "side: stored and effective parameters, FLOPs and milliseconds per image.")
    f.add_argument("args", nargs="*", metavar="[CONFIG.yaml|RUN_DIR] [key=value ...]",
                   help="a config (default: the embedded one) or a run directory, then model overrides")
    f.add_argument("--operators", default="conv,transformer", help="operators to profile (default conv,transformer)")
    f.add_argument("--no-matched", action="store_true",
                   help="leave out the conventional unshared VAE with the LoopVAE's stored-parameter budget")
    f.add_argument("--batch-size", type=int, default=16, help="images per timed batch (default 16)")
    f.add_argument("--repeats", type=int, default=5, help="timed batches; the fastest is reported (default 5)")
    add_device_arg(f)
    f.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    f.add_argument("--out", type=Path, help="folder for vae_profile.csv (default: the RUN_DIR given, else "
                                            "runs/vae_profile-<time>; never the current folder)")
    f.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _run_opts(p, loops: bool = True):
    if loops:
        p.add_argument("--loops", help="loops per scale for encoder and decoder: N or N1,N2,... (default: trained)")
        p.add_argument("--enc-loops", help="encoder loops per scale (overrides --loops)")
        p.add_argument("--dec-loops", help="decoder loops per scale (overrides --loops)")
    p.add_argument("--data-root", help="override data.root (data moved since training)")
    p.add_argument("--num-images", type=int, help="evaluate on at most this many test images")
    p.add_argument("--images", dest="num_images", type=int, action=DeprecatedOption, new="--num-images")
    add_force_arg(p)
    add_device_arg(p)


def run(args) -> int:
    cmd = getattr(args, "vae_command", None)
    if cmd is None:
        raise UserError("give a subcommand: recurvit vae train|eval|intervene|profile (see recurvit vae -h)")
    return {"train": _train, "eval": _eval, "intervene": _intervene, "profile": _profile}[cmd](args)


def _train(args) -> int:
    from ..tasks.vae.config import default_config_path, load_vae_config
    from ..tasks.vae.task import VAETask
    from ..train.fit import fit

    from ..run import distributed as dist_io

    cfg = load_run_config(args, load_vae_config, default_config_path())
    out = args.resume if args.resume is not None else args.out
    if args.nproc is not None and args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc is not None and args.nproc > 1:
        return launch_processes(args, cfg, out, ["vae", "train"])
    task = VAETask(cfg)
    metrics = fit(task, out, resume=args.resume is not None, log=(lambda *a, **k: None) if args.json else print)
    if not dist_io.launched_main():  # fit quiets every rank but 0 itself
        return 0
    out = task.run_dir
    if args.json:
        print_json({"run_dir": str(out), **metrics})
    else:
        print(f"run {out}  test_psnr {metrics.get('test_psnr', float('nan')):.2f} dB  "
              f"test_ssim {metrics.get('test_ssim', float('nan')):.4f}  "
              f"mean-image baseline {metrics.get('baseline_psnr', float('nan')):.2f} dB  "
              f"train_seconds {metrics.get('train_seconds', 0):.1f}")
    return 0


def _setup(args):
    """(model on device, cfg, test set, test loader, device) of a run."""
    from ..run.device import pick_device
    from ..tasks.vae.data import build_vae_datasets
    from ..tasks.vae.evaluate import load_vae_run, make_test_loader

    model, cfg, _ = load_vae_run(args.run)
    if args.data_root:
        cfg.data.root = args.data_root
    if args.num_images is not None:
        cfg.data.max_test = args.num_images
    device = pick_device(args.device)
    model.to(device)
    train_set, test_set, _ = build_vae_datasets(cfg.data, cfg.train.seed)
    return model, cfg, train_set, test_set, make_test_loader(test_set, 256), device


def _eval(args) -> int:
    from ..tasks.vae.data import mean_image
    from ..tasks.vae.evaluate import evaluate_vae, mean_image_baseline, save_grid

    model, cfg, train_set, test_set, loader, device = _setup(args)
    run = {"loops": _loops(args.loops, "--loops"), "enc_loops": _loops(args.enc_loops, "--enc-loops"),
           "dec_loops": _loops(args.dec_loops, "--dec-loops")}
    try:
        enc, dec = model.resolve_loops(**run)
    except ValueError as e:
        raise UserError(str(e)) from None
    lpips = inception = None
    if args.lpips or args.lpips_weights or args.vgg_weights:
        from ..tasks.vae.metrics import LPIPS

        lpips = LPIPS(args.vgg_weights, args.lpips_weights).to(device)
    if args.rfid or args.inception_weights:
        from ..tasks.vae.metrics import InceptionFeatures

        inception = InceptionFeatures(args.inception_weights).to(device)
    res = evaluate_vae(model, loader, device, cfg.train.amp, lpips=lpips, inception=inception,
                       enc_loops=enc, dec_loops=dec)
    base = mean_image_baseline(mean_image(train_set), loader)
    grid_path = args.grid or (Path(args.run) if Path(args.run).is_dir() else Path(args.run).parent) / "recon_grid.png"
    save_grid(model, test_set, grid_path, device, amp=cfg.train.amp, enc_loops=enc, dec_loops=dec)
    out = {"run": str(args.run), "model": cfg.model.name, "operator": model.cfg.operator, "core": model.cfg.core,
           "enc_loops": enc, "dec_loops": dec, "trained_loops": model.cfg.loops,
           "block_applications": model.block_applications(enc_loops=enc, dec_loops=dec)["total"],
           **{k: res[k] for k in ("psnr", "ssim", "l1", "kl", "out_of_range", "n")},
           **({"lpips": res["lpips"]} if "lpips" in res else {}), **({"rfid": res["rfid"]} if "rfid" in res else {}),
           "baseline_mean_image_psnr": base["psnr"], "baseline_mean_image_ssim": base["ssim"],
           "baseline_test_mean_image_psnr": base["oracle_psnr"], "grid": str(grid_path)}
    if args.json:
        print_json(out)
    else:
        extra = "".join(f"  {k} {out[k]:.4f}" for k in ("lpips", "rfid") if k in out)
        print(f"{out['model']} loops enc {enc} dec {dec}  PSNR {res['psnr']:.2f} dB  SSIM {res['ssim']:.4f}{extra}  "
              f"out-of-range {100 * res['out_of_range']:.2f}%  (n={res['n']}; mean-image baseline "
              f"{base['psnr']:.2f} dB / {base['ssim']:.4f})  grid {grid_path}")
    return 0


def _check_cost(model, loader, device, specs, args) -> None:
    """The interventions priced by their block applications before they run (``--extra 100000000``)."""
    from ..analysis.budget import check_applications_cost

    x = next(iter(loader)).to(device)  # a batch of images (the VAE's loaders carry no labels)
    total = sum(model.block_applications(enc_loops=s["enc"], dec_loops=s["dec"])["total"] for s in specs)
    check_applications_cost(lambda: model.eval().reconstruct(x, sample=False), model.block_applications()["total"],
                            total, len(loader), "these interventions (--truncate / --extra / --factors)",
                            force=args.force)


def _intervene(args) -> int:
    from ..tasks.vae.interventions import intervention_specs, plot, run_interventions, write_csv

    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    bad = [s for s in sides if s not in ("encoder", "decoder")]
    if bad:
        raise UserError(f"--sides takes encoder and/or decoder, got {', '.join(bad)}")
    truncate = _ints(args.truncate, "--truncate", 1) if args.truncate else []
    extra = _ints(args.extra, "--extra", 1) if args.extra else []
    factors = _floats(args.factors, "--factors") if args.factors else []
    model, cfg, _, _, loader, device = _setup(args)
    most = max([*model.cfg.loops, *model.cfg.dec_loops])  # values that were clamped in silence
    if args.loop is not None and not 0 <= args.loop < most:
        raise UserError(f"--loop {args.loop}: this model's scales run loops 0..{most - 1}; choose one of them")
    if any(k > most for k in truncate):
        raise UserError(f"--truncate {max(truncate)} removes more loops than any scale runs ({most}); choose at most "
                        f"{most}")
    specs = intervention_specs(model, truncate, extra, factors, args.loop, sides)
    _check_cost(model, loader, device, specs, args)
    rows = run_interventions(model, loader, device, specs, cfg.train.amp, progress=not args.json)
    from ..run.outputs import output_dir

    out = output_dir(args.out or (Path(args.run) if Path(args.run).is_dir() else Path(args.run).parent))
    csv_path = write_csv(rows, out / "intervene.csv")
    png_path = plot(rows, out / "intervene.png", title=f"{cfg.model.name}: loop interventions on {cfg.data.name}")
    if args.json:
        print_json({"run": str(args.run), "csv": str(csv_path), "plot": str(png_path), "rows": rows})
    else:
        print(f"{'kind':<13}{'side':<9}{'scale':>5}{'loop':>5}{'factor':>7}  {'enc':<8}{'dec':<8}{'apps':>5}"
              f"{'PSNR':>8}{'dPSNR':>8}{'SSIM':>8}{'out%':>7}")
        for r in rows:
            fac = f"{r['factor']:.2f}" if r["factor"] != "" else ""
            print(f"{r['kind']:<13}{r['side']:<9}{r['scale']!s:>5}{r['loop']!s:>5}{fac:>7}  {r['enc_loops']:<8}"
                  f"{r['dec_loops']:<8}{r['block_applications']:>5}{r['psnr']:>8.2f}{r['delta_psnr']:>8.2f}"
                  f"{r['ssim']:>8.4f}{100 * r['out_of_range']:>7.2f}")
        print(f"wrote {csv_path} and {png_path}")
    return 0


def _profile_csv(out, target) -> Path:
    """Where ``vae profile`` writes: OUT/vae_profile.csv; OUT defaults to the run directory profiled, else a
    new runs/vae_profile-<time> (an --out ending in .csv, the old spelling, is that file, with a note)."""
    import time

    from ..run.outputs import output_dir

    if out is not None and Path(out).suffix == ".csv":
        deprecated("--out FILE.csv", f"--out {Path(out).parent} (a folder; the file is vae_profile.csv)")
        return output_dir(Path(out).parent) / Path(out).name
    if out is None:
        out = Path(target) if target is not None and Path(target).is_dir() else \
            Path("runs") / f"vae_profile-{time.strftime('%Y%m%d-%H%M%S')}"
    return output_dir(Path(out)) / "vae_profile.csv"


def _profile(args) -> int:
    import torch

    from ..tasks.vae.config import apply_overrides, config_from_dict, default_config_path, load_vae_config
    from ..tasks.vae.data import build_vae_datasets
    from ..tasks.vae.profile import profile_models, write_csv
    from ..tasks.vae.task import resolve_vae_config

    target, overrides = config_and_overrides(args.args)
    if target is not None and Path(target).is_dir():
        from ..run import checkpoint as ckpt_io

        cfg = apply_overrides(config_from_dict(ckpt_io.load_checkpoint(ckpt_io.resolve_checkpoint(target))["config"]),
                              overrides)
    else:
        cfg = load_vae_config(target or default_config_path(), overrides)
    operators = [o.strip() for o in args.operators.split(",") if o.strip()]
    bad = [o for o in operators if o not in ("conv", "transformer")]
    if bad or not operators:
        raise UserError(f"--operators takes conv and/or transformer, got '{args.operators}'")
    if args.batch_size < 1 or args.repeats < 1:
        raise UserError("--batch-size and --repeats must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if cfg.model.img_size is None or cfg.model.in_chans is None:
        _, _, info = build_vae_datasets(cfg.data, cfg.train.seed)
        cfg = resolve_vae_config(cfg, info)
    rows = profile_models(cfg, operators, matched=not args.no_matched, batch=args.batch_size, repeats=args.repeats, device=args.device)
    from ..run.outputs import output_dir

    path = write_csv(rows, _profile_csv(args.out, target))
    if args.json:
        print_json({"csv": str(path), "rows": rows})
    else:
        print(f"{'model':<22}{'stored params':>14}{'eff. params':>13}{'apps':>6}{'GFLOPs fwd':>12}{'GFLOPs train':>14}"
              f"{'ms/img fwd':>12}{'ms/img train':>14}")
        for r in rows:
            print(f"{r['model']:<22}{r['params_stored']:>14,}{r['params_effective']:>13,}{r['block_applications']:>6}"
                  f"{r['flops_forward'] / 1e9:>12.3f}{r['flops_train'] / 1e9:>14.3f}{r['ms_forward']:>12.2f}"
                  f"{r['ms_train']:>14.2f}")
        print(f"wrote {path} (batch {args.batch_size}, {rows[0]['threads']} threads, {rows[0]['device']})")
    return 0

