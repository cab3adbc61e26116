"""Helpers of the server tier: evaluation settings, samples, a free port."""

from __future__ import annotations

import socket
from pathlib import Path

SERVED_NAME = "paravt-tool-tiny"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def eval_settings(**eval_fields):
    from paravt_core.config import EvalConfig, RolloutConfig, VideoConfig
    from paravt_core.eval.evaluator import EvalSettings

    fields = {"nframes": 4, "max_new_tokens": 120, "max_turns": 2, "tool_mode": "subagent", **eval_fields}
    return EvalSettings(EvalConfig(**fields), VideoConfig(nframes=4, max_pixels=6144),
                        RolloutConfig(subagent_max_new_tokens=40))


def mcq(video: Path, sample_id: str):
    from paravt_core.eval.samples import EvalSample

    question = (f"Question: What colour is the square ({sample_id})?\nOptions:\nA. red\nB. blue\n"
                "Answer with the option letter only.")
    return EvalSample(id=sample_id, split="videomme", video_path=video, question=question, answer="B", kind="mcq",
                      options=("red", "blue"))


def grounding(video: Path, sample_id: str):
    from paravt_core.eval.samples import EvalSample

    return EvalSample(id=sample_id, split="charades", video_path=video, question=f"When does the square turn ({sample_id})?",
                      answer=(1.0, 3.0), kind="grounding", gt_start=1.0, gt_end=3.0)
