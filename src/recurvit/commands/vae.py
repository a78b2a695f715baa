"""recurvit vae train|eval|intervene|profile: the LoopVAE tokenizer.

    recurvit vae train [CONFIG.yaml] [key=value ...] [--out DIR] | --resume RUN_DIR [key=value ...]
    recurvit vae eval RUN [--loops 2,2,3] [--lpips-weights F --vgg-weights F] [--inception-weights F] [--json]
    recurvit vae intervene RUN [--truncate 1,2] [--extra 1,2,4] [--factors 0,0.5,0.9,1.1,2] [--json]
    recurvit vae profile [CONFIG.yaml|RUN_DIR] [key=value ...] [--operators conv,transformer] [--out DIR] [--json]
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import (DeprecatedOption, add_device_arg, add_force_arg, comma_floats, comma_ints, config_and_overrides,
               deprecated, launch_processes, load_run_config, print_json)


def _loops(text, what):
    """'3' -> 3 (every scale), '2,2,3' -> [2, 2, 3]."""
    if text is None:
        return None
    vals = comma_ints(text, what)
    return vals[0] if len(vals) == 1 else vals


def add_parser(sub):
    p = sub.add_parser("vae", help="LoopVAE tokenizer: train, eval, intervene, profile",
                       description="LoopVAE: a VAE whose encoder and decoder each reuse one loop- and "
                                   "scale-conditioned core. With no config: configs/vae/photos.yaml (crops of "
                                   "scikit-learn's sample photographs).")
    vs = p.add_subparsers(dest="vae_command", metavar="SUBCOMMAND", parser_class=type(p))
    for add in (_add_train, _add_eval, _add_intervene, _add_profile):
        add(vs)
    return p


def _add_train(vs) -> None:
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


def _add_eval(vs) -> None:
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


def _add_intervene(vs) -> None:
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


def _add_profile(vs) -> None:
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
    from ..tasks.vae.task import train_vae_run

    cfg = load_run_config(args, load_vae_config, default_config_path())
    out = args.resume if args.resume is not None else args.out
    if args.nproc is not None and args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc is not None and args.nproc > 1:
        return launch_processes(args, cfg, out, ["vae", "train"])
    out, metrics = train_vae_run(cfg, out, resume=args.resume is not None,
                                 log=(lambda *a, **k: None) if args.json else print)
    if out is None:  # a rank that does not write the run (fit quiets it)
        return 0
    if args.json:
        print_json({"run_dir": str(out), **metrics})
    else:
        print(f"run {out}  test_psnr {metrics.get('test_psnr', float('nan')):.2f} dB  "
              f"test_ssim {metrics.get('test_ssim', float('nan')):.4f}  "
              f"mean-image baseline {metrics.get('baseline_psnr', float('nan')):.2f} dB  "
              f"train_seconds {metrics.get('train_seconds', 0):.1f}")
    return 0


def _open(args):
    from ..tasks.vae.evaluate import open_vae_run

    return open_vae_run(args.run, args.data_root, args.num_images, args.device)


def _eval(args) -> int:
    from ..tasks.vae.evaluate import evaluate_run

    run = _open(args)
    out = evaluate_run(run, _loops(args.loops, "--loops"), _loops(args.enc_loops, "--enc-loops"),
                       _loops(args.dec_loops, "--dec-loops"), lpips=args.lpips, lpips_weights=args.lpips_weights,
                       vgg_weights=args.vgg_weights, rfid=args.rfid, inception_weights=args.inception_weights,
                       grid=args.grid)
    if args.json:
        print_json(out)
    else:
        extra = "".join(f"  {k} {out[k]:.4f}" for k in ("lpips", "rfid") if k in out)
        print(f"{out['model']} loops enc {out['enc_loops']} dec {out['dec_loops']}  PSNR {out['psnr']:.2f} dB  "
              f"SSIM {out['ssim']:.4f}{extra}  out-of-range {100 * out['out_of_range']:.2f}%  (n={out['n']}; "
              f"mean-image baseline {out['baseline_mean_image_psnr']:.2f} dB / {out['baseline_mean_image_ssim']:.4f})"
              f"  grid {out['grid']}")
    return 0


def _intervene(args) -> int:
    from ..tasks.vae.interventions import intervene_run

    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    bad = [s for s in sides if s not in ("encoder", "decoder")]
    if bad:
        raise UserError(f"--sides takes encoder and/or decoder, got {', '.join(bad)}")
    truncate = comma_ints(args.truncate, "--truncate", 1) if args.truncate else []
    extra = comma_ints(args.extra, "--extra", 1) if args.extra else []
    factors = comma_floats(args.factors, "--factors") if args.factors else []
    res = intervene_run(_open(args), truncate, extra, factors, args.loop, sides, out=args.out, force=args.force,
                        progress=not args.json)
    if args.json:
        print_json(res)
        return 0
    print(f"{'kind':<13}{'side':<9}{'scale':>5}{'loop':>5}{'factor':>7}  {'enc':<8}{'dec':<8}{'apps':>5}"
          f"{'PSNR':>8}{'dPSNR':>8}{'SSIM':>8}{'out%':>7}")
    for r in res["rows"]:
        fac = f"{r['factor']:.2f}" if r["factor"] != "" else ""
        print(f"{r['kind']:<13}{r['side']:<9}{r['scale']!s:>5}{r['loop']!s:>5}{fac:>7}  {r['enc_loops']:<8}"
              f"{r['dec_loops']:<8}{r['block_applications']:>5}{r['psnr']:>8.2f}{r['delta_psnr']:>8.2f}"
              f"{r['ssim']:>8.4f}{100 * r['out_of_range']:>7.2f}")
    print(f"wrote {res['csv']} and {res['plot']}")
    return 0


def _profile_csv(out, target) -> Path:
    """Where ``vae profile`` writes (:func:`recurvit.tasks.vae.profile.profile_csv`, the old spelling noted)."""
    from ..tasks.vae.profile import profile_csv

    return profile_csv(out, target, note=deprecated)


def _profile(args) -> int:
    from ..tasks.vae.profile import profile_vae

    target, overrides = config_and_overrides(args.args)
    res = profile_vae(target, overrides, args.operators, matched=not args.no_matched, batch=args.batch_size,
                      repeats=args.repeats, device=args.device, threads=args.threads, out=args.out, note=deprecated)
    if args.json:
        print_json(res)
        return 0
    rows = res["rows"]
    print(f"{'model':<22}{'stored params':>14}{'eff. params':>13}{'apps':>6}{'GFLOPs fwd':>12}{'GFLOPs train':>14}"
          f"{'ms/img fwd':>12}{'ms/img train':>14}")
    for r in rows:
        print(f"{r['model']:<22}{r['params_stored']:>14,}{r['params_effective']:>13,}{r['block_applications']:>6}"
              f"{r['flops_forward'] / 1e9:>12.3f}{r['flops_train'] / 1e9:>14.3f}{r['ms_forward']:>12.2f}"
              f"{r['ms_train']:>14.2f}")
    print(f"wrote {res['csv']} (batch {args.batch_size}, {rows[0]['threads']} threads, {rows[0]['device']})")
    return 0
