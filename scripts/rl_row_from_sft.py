"""Train one RL row from an existing SFT model into an output folder, then evaluate it on the
held-out split as `paravt reproduce` does (sub-agent tools, and direct); no Prefect, no cache.

What it is for: checking that a run does not depend on where it writes (the same row and seed
from the same SFT model in two folders must give identical per-step metrics and held-out
accuracy), or an extra row without re-running pretraining and SFT.

    .venv/bin/python scripts/rl_row_from_sft.py --output-dir outputs/reproduce-final \
        --sft-model outputs/reproduce/sft/<key>/model --row paragrpo --seed 0

Prints one JSON line: the RL run folder, the held-out accuracy with and without tools.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="conf/pipeline/reproduce.yaml")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--sft-model", required=True, help="an SFT model folder (with paravt_meta.json)")
    parser.add_argument("--row", default="paragrpo", help="conf/rl/<row>.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    from flows.reproduce import HELD_OUT_SPLIT, row_file
    from paravt_core.config import load_config
    from paravt_core.data import stage as data_stage
    from paravt_core.dist.weights import MODEL_META
    from paravt_core.eval import stage as eval_stage
    from paravt_core.refs import ArtifactRef, content_hash
    from paravt_core.rl import stage as rl_stage

    sft_dir = Path(args.sft_model).resolve()
    if not (sft_dir / MODEL_META).is_file():
        parser.error(f"{sft_dir} is not an exported model folder (no {MODEL_META})")
    cfg = load_config(args.config, [*args.set, f"run.output_dir={args.output_dir}", f"run.seed={args.seed}"],
                      row_file(args.config, args.row))
    data = data_stage.run(cfg)
    sft = ArtifactRef(kind="sft_model", path=sft_dir, sha256=content_hash(sft_dir))
    model = rl_stage.run(cfg, sft, data.rl)
    tools = cfg.model_copy(update={"eval": cfg.eval.model_copy(
        update={"prompt_mode": "agentic_general", "tool_mode": "subagent", "splits": (HELD_OUT_SPLIT,)})})
    direct = cfg.model_copy(update={"eval": tools.eval.model_copy(update={"prompt_mode": "direct"})})
    label = f"{args.row}-seed{args.seed}"
    with_tools = eval_stage.run(tools, model, data.eval, label)
    without = eval_stage.run(direct, model, data.eval, f"{label}-direct")
    print(json.dumps({"rl_run": str(rl_stage.run_dir(cfg, sft, data.rl)), "model_sha256": model.sha256,
                      "accuracy": with_tools.primary(HELD_OUT_SPLIT),
                      "accuracy_direct": without.primary(HELD_OUT_SPLIT)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
