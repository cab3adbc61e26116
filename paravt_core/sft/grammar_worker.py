"""The SFT grammar check in a process of its own (`grammar.run_in_own_process` launches it).

Started as a one-rank job (`dist.launch_workers`: `--local_rank=0 --job <grammar_job.json>`);
it runs `grammar.run` and writes the reports atomically to the job's `reports_file`. Its GPU
memory is returned when it exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from paravt_core.atomic import atomic_write_text
    from paravt_core.sft import grammar

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args(argv)
    job = grammar.GrammarJob.model_validate_json(Path(args.job).read_text())
    reports = grammar.run(job.config, job.base_dir, job.sft_dir, job.sft_rows_dir, job.eval_dir, job.per_split)
    atomic_write_text(job.reports_file, grammar.reports_to_json(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
