"""`paravt perception`: the sub-agent's perception check on a run's generated world (#15)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _perception(args: argparse.Namespace) -> int:
    from paravt_core.config import load_config
    from paravt_core.data.stage import load_split_file
    from paravt_core.sft.perception import perception_report, window_truths, world_manifest

    cfg = load_config(args.config, args.set)
    data = cfg.run.output_dir / "data"
    split_json = data / "eval" / args.split / "split.json"
    try:
        manifest = world_manifest(cfg)
    except FileNotFoundError as exc:
        print(f"paravt perception: {exc} ({args.config})", file=sys.stderr)
        return 2
    if not split_json.is_file():
        print(f"paravt perception: no prepared split {args.split!r} under {data}; run the data stage of "
              f"{args.config} first (source: synth)", file=sys.stderr)
        return 2
    videos = {Path(s.video_path).name: Path(s.video_path).parent for s in load_split_file(split_json)}
    video_dir = next(iter(videos.values()))
    truths = window_truths(manifest, args.split, video_dir, cfg.data.synth.max_crop_s, args.videos)
    report = perception_report(Path(args.model), cfg, truths)
    print(json.dumps({"windows": report.windows, **report.as_metrics()}, indent=1))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("perception", help="score a checkpoint's sub-agent summaries against a generated "
                                                 "world's ground truth")
    p.add_argument("--config", required=True, help="the pipeline YAML whose output_dir holds the world")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/sft/<key>/model)")
    p.add_argument("--split", default="videomme", help="evaluation split whose videos are cropped")
    p.add_argument("--videos", type=int, default=16, help="videos to crop (every grid segment of each)")
    p.set_defaults(func=_perception)
