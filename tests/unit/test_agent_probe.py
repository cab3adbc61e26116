"""The teacher-forced agent probe (#15): held-out transcripts and the scored option check."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.miniature.agent_probe import PARTS, agent_probe, probe_conversation
from paravt_core.miniature.reading_probe import check_spans

REPRODUCE = Path(__file__).resolve().parents[2] / "conf" / "pipeline" / "reproduce.yaml"
FINAL = ("<think>\nThe crop from 00:16.0 to 00:32.0 reports: From 00:20.0 to 00:21.0 a yellow square appears in "
         "the top left corner. So the answer is Yellow. Checking the options: A. Red vs Yellow: different. "
         "B. Yellow vs Yellow: same. So the answer is option B.\n</think>\n<answer>B</answer>")


def test_check_spans_find_the_check_inside_an_agent_turn():
    spans = check_spans(FINAL)
    text = {part: [FINAL[a:b] for a, b in ranges] for part, ranges in spans.items()}
    assert text["value"] == [" Yellow"]
    assert text["options"] == [" Red", " Yellow"] and text["values"] == [" Yellow", " Yellow"]
    assert text["verdicts"] == [" different", " same"] and text["letter"] == [" B"]
    assert text["chain"] == [FINAL[FINAL.index(" Yellow. Checking"):FINAL.index(".\n</think>")]]
    with pytest.raises(ValueError, match="no option check"):
        check_spans("<think>\nSo the answer is Yellow.\n</think>\n<answer>red</answer>")


def test_probe_conversations_are_held_out_tool_transcripts(tmp_path: Path):
    cfg = load_config(REPRODUCE, [])
    messages = probe_conversation(cfg, 0, 0, tmp_path)
    roles = [m["role"] for m in messages]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant" and "tool" in roles
    user = messages[1]["content"]
    assert Path(user[0]["video_url"]["url"]).is_file()  # the video is rendered for the probe
    assert "Options:\nA. " in user[1]["text"] and "option letter" in user[1]["text"]
    check_spans(messages[-1]["content"][0]["text"])  # the final turn holds the option check
    # a stream of its own: not the same video as the next probe row
    assert probe_conversation(cfg, 1, 0, tmp_path)[1]["content"][0] != user[0]


def test_agent_probe_scores_a_model_folder(tiny_model_dir):
    report = agent_probe(tiny_model_dir, load_config(REPRODUCE, []), rows=2)
    assert report.rows == 2 and report.distance > 100  # frames, calls and reports stand between
    assert set(report.as_metrics()) == {f"agent_{p}" for p in (*PARTS, "distance")}
    assert report.chain == 0.0  # a random-weight model copies nothing whole
