"""`paravt miniature ...`: the commands of the generated world's tiny model (docs/miniature.md).

Each probe scores one skill of a checkpoint on held-out rows drawn from the config's generated
world; `report` rebuilds the miniature reproduction's report from MLflow. `paravt reproduce`
(flows/cli.py) runs the reproduction itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paravt_core.atomic import atomic_write_text
from paravt_core.config import ConfigError, load_config

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.


def _probe_inputs(args: argparse.Namespace, command: str, example: str):
    """(config, model folder) of a probe command; a folder without config.json is refused."""
    cfg = load_config(args.config, args.set, getattr(args, "rl_row", None))
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"paravt miniature {command}: {model_dir} is not a model folder (no config.json); pass e.g. "
                         f"{cfg.run.output_dir}/{example}/<key>/model")
    return cfg, model_dir


def _prepared_split(cfg, args: argparse.Namespace, command: str) -> Path | None:
    """`<output_dir>/data/eval/<split>/split.json` (the data stage's `SPLIT_FILE`), or None after a
    one-line message saying to run the data stage."""
    from paravt_core.data.stage import SPLIT_FILE

    split_json = cfg.run.output_dir / "data" / "eval" / args.split / SPLIT_FILE
    if split_json.is_file():
        return split_json
    print(f"paravt miniature {command}: no prepared split {args.split!r} at {split_json}; run the data stage of "
          f"{args.config} first (source: synth)", file=sys.stderr)
    return None


def _print_report(counts: dict[str, int], report) -> int:
    print(json.dumps({**counts, **report.as_metrics()}, indent=1))
    return 0


def _reading_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.reading_probe import reading_probe

    cfg, model_dir = _probe_inputs(args, "reading-probe", "pretrain-reading")
    report = reading_probe(model_dir, cfg, rows=args.rows, seed=args.seed, pad=args.pad)
    return _print_report({"rows": report.rows}, report)


def _caption_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.caption_probe import caption_probe

    cfg, model_dir = _probe_inputs(args, "caption-probe", "pretrain")
    try:
        report = caption_probe(model_dir, cfg, videos=args.videos, seed=args.seed)
    except ValueError as exc:
        print(f"paravt miniature caption-probe: {exc}", file=sys.stderr)
        return 2
    return _print_report({"windows": report.windows, "events": report.events}, report)


def _agent_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.agent_probe import agent_probe

    cfg, model_dir = _probe_inputs(args, "agent-probe", "sft")
    report = agent_probe(model_dir, cfg, rows=args.rows, seed=args.seed)
    return _print_report({"rows": report.rows}, report)


def _perception(args: argparse.Namespace) -> int:
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.perception import perception_report, window_truths, world_manifest

    cfg = load_config(args.config, args.set)
    try:
        manifest = world_manifest(cfg)
    except FileNotFoundError as exc:
        print(f"paravt miniature perception: {exc} ({args.config})", file=sys.stderr)
        return 2
    split_json = _prepared_split(cfg, args, "perception")
    if split_json is None:
        return 2
    videos = {Path(s.video_path).name: Path(s.video_path).parent for s in load_split_file(split_json)}
    video_dir = next(iter(videos.values()))
    truths = window_truths(manifest, args.split, video_dir, cfg.data.synth.max_crop_s, args.videos)
    report = perception_report(Path(args.model), cfg, truths)
    print(json.dumps({"windows": report.windows, **report.as_metrics()}, indent=1))
    return 0


def _rollout_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.rollout_probe import probe_prompts, render_table, run_probe

    try:
        cfg = load_config(args.config, args.set, args.rl_row)
    except ConfigError as exc:
        print(f"paravt miniature rollout-probe: {exc}", file=sys.stderr)
        return 2
    if args.prompts < 1 or (args.group_size is not None and args.group_size < 1):
        print("paravt miniature rollout-probe: --prompts and --group-size must be at least 1", file=sys.stderr)
        return 2
    if not (Path(args.model) / "config.json").is_file():
        print(f"paravt miniature rollout-probe: {args.model} is not a model folder (no config.json)", file=sys.stderr)
        return 2
    try:
        prompts = probe_prompts(cfg, args.prompts, args.seed)
    except FileNotFoundError as exc:
        print(f"paravt miniature rollout-probe: {exc}", file=sys.stderr)
        return 2
    temperatures = args.temperature or [cfg.rl.temperature]
    if any(t < 0 for t in temperatures):
        print("paravt miniature rollout-probe: temperatures must be >= 0", file=sys.stderr)
        return 2
    results = run_probe(Path(args.model), cfg, prompts, temperatures, args.group_size or cfg.rl.group_size)
    print(render_table(results))
    return 0


def _opening_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.opening_probe import probe_split, render_tables, summarize

    cfg, model_dir = _probe_inputs(args, "opening-probe", "sft")
    split_json = _prepared_split(cfg, args, "opening-probe")
    if split_json is None:
        return 2
    frame_counts = args.frames or sorted({*cfg.rl.gating.choices, cfg.eval.nframes})
    if args.rows < 1 or any(k < 1 for k in frame_counts):
        print("paravt miniature opening-probe: --rows and --frames must be at least 1", file=sys.stderr)
        return 2
    records = probe_split(model_dir, cfg, split_json, frame_counts, args.rows)
    tables = render_tables(summarize(records))
    print(tables)
    if args.out:
        out = Path(args.out)
        rows = [{"sample_id": r.sample_id, "group": r.group, "nframes": r.nframes, "first_tokens": r.first_tokens,
                 "along": r.along, "greedy": r.greedy, "greedy_text": r.greedy_text} for r in records]

        atomic_write_text(out, json.dumps({"model": str(model_dir), "split": args.split, "tables": tables,
                                           "records": rows}, indent=1))
    return 0


def _branch_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.branch_probe import branch_probe, precondition, render, scored_under, summarize

    cfg, model_dir = _probe_inputs(args, "branch-probe", "sft")
    split_json = _prepared_split(cfg, args, "branch-probe")
    if split_json is None:
        return 2
    frame_counts = sorted(set(args.frames or (min(cfg.rl.gating.choices), max(cfg.rl.gating.choices))))
    if min(args.questions, args.samples, *frame_counts) < 1:
        print("paravt miniature branch-probe: --questions, --samples and --frames must be at least 1", file=sys.stderr)
        return 2
    records = branch_probe(model_dir, cfg, split_json, args.questions, args.samples, frame_counts,
                           args.temperature, args.seed)
    summaries = summarize(records)
    print(scored_under(cfg) + "\n")
    print(render(summaries))
    shown = _shown_on_overview(cfg, split_json, args.split, frame_counts)
    if shown is not None:
        from paravt_core.miniature.branch_probe import render_by_shown

        print("\nBy whether the K overview frames show the question's event (the world's ground truth):\n")
        print(render_by_shown(records, shown))
    _print_push(records, shown, cfg, args.push_p, args.group_size)
    if args.out:
        from dataclasses import asdict

        atomic_write_text(Path(args.out), json.dumps({
            "model": str(model_dir), "split": args.split, "samples": args.samples, "temperature": args.temperature,
            "row": cfg.rl.row, "scored_under": scored_under(cfg),
            "summaries": [asdict(s) for s in summaries],
            "precondition": [{"check": text, "holds": ok} for text, ok in precondition(summaries)],
            "records": [asdict(r) for r in records],
            "shown": None if shown is None else [{"sample_id": i, "nframes": k, "shown": v}
                                                 for (i, k), v in sorted(shown.items())]}, indent=1))
    return 0


def _print_push(records, shown, cfg, p_crops, group_size) -> None:
    from paravt_core.miniature.branch_probe import push_rows, render_push

    group = group_size or cfg.rl.group_size
    rows = push_rows(records, p_crops or (0.1, 0.3, 0.5), group, shown, shift=cfg.rl.reward_shift,
                     scale=cfg.rl.reward_scale, clip=cfg.rl.reward_clip, eps=cfg.rl.adv_eps)
    print("\nWhich way GRPO's group-normalized advantage pushes the crop decision, if the policy crops with "
          "probability π:\n")
    print(render_push(rows, group))


def _branch_push(args: argparse.Namespace) -> int:
    from paravt_core.miniature.branch_probe import BranchRecord

    cfg = load_config(args.config, args.set, args.rl_row)
    source = Path(args.source)
    try:
        saved = json.loads(source.read_text())
        records = [BranchRecord(**{**r, "samples": {b: tuple(v) for b, v in r.get("samples", {}).items()}})
                   for r in saved["records"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"paravt miniature branch-push: {source} is not a branch probe's --out file ({error})", file=sys.stderr)
        return 2
    shown = None if saved.get("shown") is None else {(r["sample_id"], r["nframes"]): r["shown"] for r in saved["shown"]}
    if saved.get("scored_under"):  # the rewards are the probe's: its row, not --rl-row, scored them
        print(f"{source}: {saved['scored_under']}")
    try:
        _print_push(records, shown, cfg, args.push_p, args.group_size)
    except ValueError as error:
        print(f"paravt miniature branch-push: {source}: {error}", file=sys.stderr)
        return 2
    return 0


def _advantage_split(args: argparse.Namespace) -> int:
    from paravt_core.data.mirror import world_dir
    from paravt_core.miniature.advantage_split import render, split_rows, train_videos_by_name
    from paravt_core.rl.episode_log import read_episode_log

    cfg = load_config(args.config, args.set)
    manifest = _world_manifest(cfg)
    if manifest is None:
        print(f"paravt miniature advantage-split: no generated world's manifest at {world_dir(cfg) / 'manifest.json'}; "
              "pass the config (and --set) the run was trained with", file=sys.stderr)
        return 2
    if args.blocks < 1:
        print("paravt miniature advantage-split: --blocks must be at least 1", file=sys.stderr)
        return 2
    try:
        records = read_episode_log(Path(args.run))
        rows = split_rows(records, train_videos_by_name(manifest), args.blocks)
    except (OSError, ValueError) as error:
        print(f"paravt miniature advantage-split: {error}", file=sys.stderr)
        return 2
    print(render(rows))
    return 0


def _world_manifest(cfg) -> dict | None:
    """The generated world's ground truth (`manifest.json`) when the config's world is on disk; else None."""
    from paravt_core.data.mirror import world_dir

    path = world_dir(cfg) / "manifest.json"
    if cfg.data.source != "synth" or not path.is_file():
        return None
    return json.loads(path.read_text())


def _shown_on_overview(cfg, split_json: Path, split: str, frame_counts) -> dict | None:
    """(sample id, K) -> event on the K frames, for a generated world whose manifest is on disk; else None."""
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.branch_probe import shown_on_overview

    manifest = _world_manifest(cfg)
    if manifest is None:
        return None
    return shown_on_overview(load_split_file(split_json), manifest, split, frame_counts)


def _config_args(p: argparse.ArgumentParser, config_help: str, rl_row_help: str | None = None) -> None:
    """--config and --set (and --rl-row when `rl_row_help` is given) of a command that loads a pipeline config."""
    p.add_argument("--config", required=True, help=config_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    if rl_row_help is not None:
        p.add_argument("--rl-row", default=None, help=rl_row_help)


def _push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--push-p", type=float, action="append", default=None, metavar="P",
                   help="a crop probability π for GRPO's push, repeatable (default: 0.1, 0.3 and 0.5)")
    p.add_argument("--group-size", type=int, default=None, help="rollouts per group for the push (default: rl.group_size)")


def _split_probe_args(p: argparse.ArgumentParser) -> None:
    """--config, --set and --model of a probe that reads a prepared evaluation split."""
    p.add_argument("--config", required=True, help="the pipeline YAML whose output_dir holds the prepared split")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/sft/<key>/model)")


def _sampled_probe(args: argparse.Namespace) -> int:
    from paravt_core.miniature.heldout_probe import sampled_probe

    cfg, model_dir = _probe_inputs(args, "sampled-probe", "sft")
    split_json = _prepared_split(cfg, args, "sampled-probe")
    if split_json is None:
        return 2
    k = args.frames or max(cfg.rl.gating.choices)
    if min(args.questions, args.samples, k) < 1 or args.temperature < 0:
        print("paravt miniature sampled-probe: --questions, --samples and --frames must be at least 1, "
              "--temperature at least 0", file=sys.stderr)
        return 2
    result = sampled_probe(model_dir, cfg, split_json, args.questions, args.samples, k, args.temperature, args.seed)
    report = {"model": str(model_dir), "split": args.split, "k": k, "samples": args.samples,
              "temperature": args.temperature, "questions": len(result.calls),
              "kappa": sum(result.calls.values()) / len(result.calls),
              "format": sum(result.fmt.values()) / len(result.fmt)}
    print(json.dumps(report, indent=1))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({**report, "probe_calls": result.calls,
                                                      "probe_format": result.fmt}, indent=1))
    return 0


def _report(args: argparse.Namespace) -> int:
    from paravt_core.miniature import reproduce
    from paravt_core.miniature.measurements import MeasurementsError

    sources = [Path(folder) for folder in args.from_dir or ()]
    profile = log_uri = None
    if args.log_to:
        if not sources:
            print("paravt miniature report: --log-to logs a report rebuilt from report folders (--from); one "
                  "rebuilt from MLflow is there already", file=sys.stderr)
            return 2
        log_uri = args.tracking_uri or load_config(args.config).mlflow_uri()
    if sources:
        if len(sources) > 1 and not args.out:
            print("paravt miniature report: give --out for the report of several parts", file=sys.stderr)
            return 2
        source = f"the measurements in {', '.join(map(str, sources))}"
        # never the folder read: a rebuild that fails half-way there would damage the measurements (#48)
        first = sources[0].resolve()
        out = Path(args.out) if args.out else first.with_name(f"{first.name}-rebuilt")
        title = f"Miniature reproduction: `{first.parent.name}`" + (f", {len(sources)} parts" if len(sources) > 1 else "")
        try:
            runs, budget, running, profile = reproduce.read_parts(sources)
        except ValueError as exc:
            print(f"paravt miniature report: {exc}", file=sys.stderr)
            return 2
    else:
        if not args.experiment:
            print("paravt miniature report: give --experiment (MLflow) or --from (a report folder)", file=sys.stderr)
            return 2
        uri = args.tracking_uri or load_config(args.config).mlflow_uri()
        source, out = f"MLflow ({uri})", Path(args.out or f"outputs/report/{args.experiment}")
        title = f"Miniature reproduction: experiment `{args.experiment}`"
        try:
            runs, budget, running = reproduce.latest_logged(uri, args.experiment)
        except ValueError as exc:  # no such experiment, or no reproduction logged in it
            print(f"paravt miniature report: {exc}", file=sys.stderr)
            return 2
    try:
        path = reproduce.rebuild_report(runs, out, title, budget, sources, running, profile, log_uri, args.log_to)
    except (MeasurementsError, reproduce.ReportLogError) as exc:
        print(f"paravt miniature report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or full --out: the earlier report, if any, is left whole
        print(f"paravt miniature report: cannot write the report to {out}: {exc.strerror or exc} "
              f"({exc.filename or out}); give a writable --out with free space", file=sys.stderr)
        return 2
    print(path.read_text())
    print(f"report written to {path} (figure and measurements beside it), from {source}"
          + (f"; logged to MLflow experiment {args.log_to!r} ({log_uri})" if args.log_to else ""))
    return 0


def _visibility(args: argparse.Namespace) -> int:
    from paravt_core.data.mirror import ensure_world, world_dir
    from paravt_core.miniature.visibility import table_markdown, visibility_table

    cfg = load_config(args.config, args.set)
    if cfg.data.source != "synth":
        raise SystemExit(f"paravt miniature visibility: {args.config} has data.source {cfg.data.source}; only a "
                         "generated world (data.source: synth) has the ground truth it counts")
    budgets = args.budget or sorted({*cfg.rl.gating.choices, cfg.video.nframes, cfg.eval.nframes})
    ensure_world(cfg)  # generated once, then reused (the data stage's world)
    root = world_dir(cfg)
    manifest = json.loads((root / "manifest.json").read_text())
    print(f"Share of videos with an event on their K overview frames (world {root}):\n")
    print(table_markdown(visibility_table(manifest, budgets)))
    if args.eval:
        return _eval_by_shown(cfg, manifest, Path(args.eval), args.budget or [cfg.eval.nframes])
    return 0


def _eval_by_shown(cfg, manifest: dict, records_file: Path, budgets) -> int:
    """`--eval`: the evaluation's records split by whether each question's K frames show its event."""
    from paravt_core.data.stage import SPLIT_FILE
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.visibility import records_by_shown, shown_markdown, videos_of_samples

    if not records_file.is_file():
        print(f"paravt miniature visibility: no evaluation records at {records_file} (an eval folder's "
              "<split>.jsonl)", file=sys.stderr)
        return 2
    split = records_file.stem
    split_json = cfg.run.output_dir / "data" / "eval" / split / SPLIT_FILE
    block = manifest.get("eval", {}).get(split)
    if block is None or not split_json.is_file():
        print(f"paravt miniature visibility: split {split!r} of {records_file} is not a prepared split of this "
              f"world (looked for {split_json} and the manifest's eval.{split})", file=sys.stderr)
        return 2
    video_of = videos_of_samples(manifest, split, load_split_file(split_json))
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()]
    for k in budgets:
        print(f"\n{records_file} by whether the K={k} overview frames show the question's event:\n")
        print(shown_markdown(records_by_shown(records, video_of, k), k))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "miniature", help="the tiny model's probes and the reproduction's report (docs/miniature.md)",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    commands = group.add_subparsers(dest="miniature_command", required=True, metavar="MINIATURE_COMMAND")
    probes = (
        ("reading-probe", _reading_probe, "teacher-forced scores of a checkpoint's reading skill (quote, value, "
         "option checks, letter) on held-out reading rows", "rows", "pretrain-reading",
         ("--rows", 200, "multiple-choice reading rows to score")),
        ("caption-probe", _caption_probe, "teacher-forced scores of what a checkpoint sees in held-out crops (event "
         "colour, shape, place, times)", "clips", "pretrain",
         ("--videos", 24, "held-out videos whose grid segments are scored")),
        ("agent-probe", _agent_probe, "teacher-forced scores of the final option check in held-out agent "
         "transcripts (value, option lines, verdicts, letter)", "questions", "sft",
         ("--rows", 64, "held-out multiple-choice transcripts to score")),
    )
    for name, func, help_text, drawn, example, (flag, default, flag_help) in probes:
        p = commands.add_parser(name, help=help_text)
        p.add_argument("--config", required=True, help=f"the pipeline YAML whose world the {drawn} are drawn from")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--model", required=True, help=f"model folder (e.g. <output_dir>/{example}/<key>/model)")
        p.add_argument(flag, type=int, default=default, help=flag_help)
        p.add_argument("--seed", type=int, default=0, help="the probe stream's seed")
        if name == "reading-probe":
            p.add_argument("--pad", type=int, default=0, help="lead each answer's quote with this many empty-window "
                           "notes: options that far further back (a copy by fixed distance fails, a lookup does not)")
        p.set_defaults(func=func)

    p = commands.add_parser("perception", help="score a checkpoint's sub-agent summaries (greedy, on the "
                                               "sub-agent's own prompt) against the generated world's ground truth")
    p.add_argument("--config", required=True, help="the pipeline YAML whose output_dir holds the world")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/sft/<key>/model)")
    p.add_argument("--split", default="videomme", help="evaluation split whose videos are cropped")
    p.add_argument("--videos", type=int, default=16, help="videos to crop (every grid segment of each)")
    p.set_defaults(func=_perception)

    p = commands.add_parser(
        "rollout-probe",
        help="sample RL-style rollout groups from a checkpoint and report what GRPO could learn from them",
        description="GRPO's accuracy term learns only from groups whose rollouts disagree (SPEC §5). Samples "
                    "rl.group_size rollouts of N RL prompts as the first RL step does (the row's rollout knobs, "
                    "reward and gating budget) and prints, per ground-truth answer, accuracy, the share of mixed "
                    "groups, tool calls and the answers given.",
    )
    p.add_argument("--config", required=True, help="the pipeline YAML whose output_dir holds the RL shards")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rl-row", default=None, help="RL ablation row (conf/rl/*.yaml) laid over the rl section")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/sft/<key>/model)")
    p.add_argument("--prompts", type=int, default=24, help="RL prompts to roll out")
    p.add_argument("--group-size", type=int, default=None, help="rollouts per prompt (default: rl.group_size)")
    p.add_argument("--temperature", type=float, action="append", default=None,
                   help="sampling temperature, repeatable (default: rl.temperature; 0 is greedy)")
    p.add_argument("--seed", type=int, default=1, help="which prompts are drawn")
    p.set_defaults(func=_rollout_probe)

    p = commands.add_parser(
        "opening-probe",
        help="the next-token distribution after the think prefix on held-out questions, each teacher opening "
             "(crop or not) teacher-forced, and what greedy decoding writes: where the crop decision goes",
        description="Puts each question of an evaluation split to the model as the agentic evaluation does, at "
                    "each overview budget K, and prints per K and question wording: the crop openings' share of "
                    "the teacher openings' probability, the openings' first-token probabilities, each opening "
                    "token by token, and which opening greedy decoding follows (paravt_core/miniature/"
                    "opening_probe.py).")
    _split_probe_args(p)
    p.add_argument("--split", default="videomme_val", help="prepared evaluation split (validation by default)")
    p.add_argument("--rows", type=int, default=32, help="questions of the split, from its first")
    p.add_argument("--frames", type=int, action="append", default=None,
                   help="an overview budget K, repeatable (default: rl.gating.choices and eval.nframes)")
    p.add_argument("--out", default=None, help="also write the tables and per-question records as JSON here")
    p.set_defaults(func=_opening_probe)

    p = commands.add_parser(
        "sampled-probe",
        help="κ (crop calls per episode) and format (fixed R_fmt) per held-out question, sampled at one K",
        description="Samples episodes of each of the first N questions of a prepared evaluation split, asked as the "
                    "agentic evaluation asks at one overview budget K, and prints the mean κ and format; --out "
                    "keeps them per question (the maps the reproduction's κ and format verdicts compare).")
    _split_probe_args(p)
    p.add_argument("--split", default="videomme", help="prepared evaluation split (the test split by default)")
    p.add_argument("--questions", type=int, default=32, help="questions of the split, from its first")
    p.add_argument("--samples", type=int, default=4, help="episodes per question")
    p.add_argument("--frames", type=int, default=None, help="the overview budget K (default: the largest gating K)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (RL's is 0.7)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--out", default=None, help="also write the per-question maps as JSON here")
    p.set_defaults(func=_sampled_probe)

    p = commands.add_parser(
        "branch-probe",
        help="per held-out question, the full reward of sampled episodes forced to open with the crop plan "
             "against the skip plan, at the smallest and largest gating K: does calling pay?",
        description="Forces the main agent's first turn to open with the teacher's crop plan or its skip plan, "
                    "samples the rest (τ 0.7), scores each episode with the config's full reward and the fixed "
                    "R_fmt, and checks the precondition of the paper's tool collapse "
                    "(paravt_core/miniature/branch_probe.py, docs/miniature.md).")
    _split_probe_args(p)
    p.add_argument("--rl-row", default=None, help="the RL row whose reward and rollout knobs score and roll out the "
                                                  "episodes: a row's name (paragrpo, vanilla_grpo: conf/rl/<row>.yaml) "
                                                  "or a row file; default: the config's own rl section")
    p.add_argument("--split", default="videomme_val", help="prepared evaluation split (validation by default)")
    p.add_argument("--questions", type=int, default=32, help="questions of the split, from its first")
    p.add_argument("--samples", type=int, default=8, help="episodes per question and branch")
    p.add_argument("--frames", type=int, action="append", default=None,
                   help="an overview budget K, repeatable (default: the smallest and largest rl.gating.choices)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (RL's is 0.7)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--out", default=None, help="also write the summaries and per-question records as JSON here")
    _push_args(p)
    p.set_defaults(func=_branch_probe)

    p = commands.add_parser(
        "branch-push",
        help="from a branch probe's --out file: which way GRPO's group-normalized advantage pushes the crop "
             "decision on each question, against what its mean reward favours",
        description="Draws groups of rollouts from each question's sampled crop and skip rewards, normalizes them "
                    "as the trainer does and averages the crop logit's gradient (paravt_core/miniature/"
                    "branch_probe.py, grpo_push).")
    _config_args(p, "the pipeline YAML whose rl knobs shape the rewards",
                 "an RL row file (conf/rl/<row>.yaml) whose rl knobs apply")
    p.add_argument("--from", dest="source", required=True, help="a branch probe's --out JSON")
    _push_args(p)
    p.set_defaults(func=_branch_push)

    p = commands.add_parser(
        "advantage-split",
        help="from an RL run's episode log: crop share, rewards and the push on the crop decision, split by whether "
             "each episode's K overview frames show the asked event",
        description="Reads <run>/episodes/*.jsonl (rl/episode_log.py) and the world's manifest "
                    "(paravt_core/miniature/advantage_split.py).")
    _config_args(p, "the pipeline YAML (with --set) the run's world was generated from")
    p.add_argument("--run", required=True, help="the RL run folder (outputs/.../rl/<row>-<key>)")
    p.add_argument("--blocks", type=int, default=1, help="cut the steps into this many consecutive blocks")
    p.set_defaults(func=_advantage_split)

    p = commands.add_parser("visibility", help="the share of the generated world's videos whose events show on "
                                               "K overview frames, per K (what nFrames gating can act on)")
    p.add_argument("--config", required=True, help="the pipeline YAML whose generated world is counted")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--budget", type=int, action="append", default=None,
                   help="an overview budget K, repeatable (default: rl.gating.choices, video.nframes, eval.nframes)")
    p.add_argument("--eval", default=None, metavar="FILE",
                   help="an evaluation's per-question records (<output_dir>/eval/<key>/<split>.jsonl): also split its "
                        "accuracy and crop calls by whether the K frames show each question's event (K: --budget, "
                        "default eval.nframes, the K that evaluation used)")
    p.set_defaults(func=_visibility)

    p = commands.add_parser("report", help="the reproduction's table (95 %% intervals over seeds), findings and "
                                           "per-step figure, rebuilt from an MLflow experiment or a report folder",
                               description="Rebuild the reproduction's report from the measurements (runs.json, "
                                           "budget.json) logged in MLflow or kept in a report folder. Exit 0: report "
                                           "written; 2: the measurements are missing or invalid (the message names "
                                           "the file and the entry: a run listed twice, a second SFT model, an "
                                           "empty row name, a malformed step record), --out would overwrite the "
                                           "folder read or files that are not a report's, or --out cannot be "
                                           "written (read-only, full).")
    p.add_argument("--experiment", default=None, help="MLflow experiment name (mlflow.experiment in the config)")
    p.add_argument("--from", dest="from_dir", action="append", default=None,
                   help="a report folder (<run.output_dir>/report) to rebuild from its runs.json and budget.json "
                        "instead of MLflow; written to <DIR>-rebuilt unless --out, never into DIR itself. "
                        "Repeated: the parts of a profile run in parts (each a set of its SFT builds, "
                        "reproduce.sft_seeds, with the same settings otherwise), in any order, merged into one report "
                        "at --out (the budget sweep of the part with the lowest first build, the parts' running "
                        "times added up)")
    p.add_argument("--log-to", default=None, metavar="EXPERIMENT",
                   help="with --from: log the rebuilt report to this MLflow experiment as one run (its rows' "
                        "accuracies, running time and files), e.g. a profile's parts merged, beside the parts' own "
                        "runs in paravt-reproduce-conclusive; --experiment then rebuilds it from there")
    p.add_argument("--config", default="conf/pipeline/reproduce.yaml",
                   help="pipeline YAML whose MLflow store to read (or, with --log-to, to log to)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (overrides the config's)")
    p.add_argument("--out", default=None, help="output folder, a new one or an earlier report's, replaced whole "
                                               "(default outputs/report/<experiment>)")
    p.set_defaults(func=_report)
