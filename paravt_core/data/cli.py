"""`paravt synth`: generate the synthetic long-video world as a local hub cache.

    paravt synth --out data/synth --seed 0 [--config conf/synth.yaml]

The YAML holds `SynthConfig` fields, at the top level or under a `synth:` key; `--seed`
overrides its seed. Heavy imports (PyAV, pyarrow) happen inside the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paravt_core.atomic import output_folder
from paravt_core.config import read_yaml_mapping
from paravt_core.data.synth import SynthConfig, generate_world
from paravt_core.seeds import seed_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "synth",
        help="generate the synthetic long-video world (ParaVT and benchmark repos) as a local hub cache",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--out", required=True, type=output_folder, help="output folder; the hub cache goes to OUT/hub")
    parser.add_argument("--seed", type=seed_argument, default=None, help="random seed (overrides the config's)")
    parser.add_argument("--config", type=Path, default=None, help="YAML file with SynthConfig fields")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_synth)


def load_synth_config(path: Path | None, seed: int | None):
    """SynthConfig from an optional YAML file, with the seed overridden when given."""
    fields = {}
    if path is not None:
        fields = read_yaml_mapping(Path(path), "synth config")
        if set(fields) == {"synth"}:
            fields = fields["synth"]
    if seed is not None:
        fields = {**fields, "seed": seed}
    return SynthConfig.model_validate(fields)


def _human_size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def summary_table(world) -> str:
    """Rows per shard and split, size per repo, totals and time."""
    width = max(len(name) for name in [*world.counts, *world.repos]) + 2
    lines = [f"{'shard / split':<{width}}{'rows':>8}"]
    lines += [f"{name:<{width}}{n:>8}" for name, n in world.counts.items()]
    lines += ["", f"{'repo':<{width}}{'files':>8}{'size':>12}"]
    lines += [f"{r.repo_id:<{width}}{len(r.files):>8}{_human_size(r.size_bytes):>12}" for r in world.repos.values()]
    lines += [
        "",
        f"total {_human_size(world.size_bytes)} in {len(world.repos)} repos, {world.seconds:.1f} s",
        f"hub cache: {world.hub_cache}   manifest: {world.manifest}",
    ]
    return "\n".join(lines)


def run_synth(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        cfg = load_synth_config(args.config, args.seed)
    except (ValidationError, OSError) as error:
        print(f"paravt synth: bad config {args.config or '(defaults)'}: {error}", file=sys.stderr)
        return 2
    world = generate_world(cfg, args.out, progress=not args.quiet)
    print(summary_table(world))
    return 0
