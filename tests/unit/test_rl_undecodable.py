"""RL drops a prompt whose video does not decode for the step, with a warning, and goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.rl.data import RLPrompt, rollout_dropping_undecodable
from paravt_core.video import VideoFile
from paravt_core.video.errors import VideoDecodeError
from tests.conftest import write_test_video


def _prompt(video: Path) -> RLPrompt:
    messages = ({"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which colour?"}]},)
    return RLPrompt(EpisodePrompt(prompt_id=video.stem, video_path=video, messages=messages, tools=()), "A", "mcq", "")


def opening_rollout(calls: list[list[str]]):
    """A rollout that, like `run_episodes`, opens every prompt's video first."""

    def run(batch: list[RLPrompt]) -> list[str]:
        calls.append([p.prompt.prompt_id for p in batch])
        for p in batch:
            with VideoFile(p.prompt.video_path):
                pass
        return [f"episode of {p.prompt.prompt_id}" for p in batch]

    return run


def test_a_prompt_with_an_undecodable_video_is_dropped_with_a_warning(tmp_path):
    good = write_test_video(tmp_path / "good.mp4", seconds=2.0)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    prompts = [_prompt(good), _prompt(empty), _prompt(good)]
    calls, warnings, undecodable = [], [], set()
    kept, episodes = rollout_dropping_undecodable(prompts, opening_rollout(calls), undecodable, warnings.append)
    assert kept == [prompts[0], prompts[2]] and episodes == ["episode of good", "episode of good"]
    assert undecodable == {str(empty)}
    (warning,) = warnings
    assert warning.startswith("warning: RL step sets aside 1 prompt(s)") and str(empty) in warning
    # a later step skips it up front: one rollout call, no new warning
    calls.clear()
    kept, _ = rollout_dropping_undecodable(prompts, opening_rollout(calls), undecodable, warnings.append)
    assert calls == [["good", "good"]] and len(warnings) == 1


def test_a_step_of_only_undecodable_videos_is_an_error_naming_them(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(VideoDecodeError, match="no prompt of this RL step has a video that decodes"):
        rollout_dropping_undecodable([_prompt(empty)], opening_rollout([]), set(), lambda line: None)


def test_no_prompts_at_all_is_not_taken_for_undecodable_videos():
    # issue #48 item 3: an empty list read "no prompt ... has a video that decodes ... undecodable so far: []"
    with pytest.raises(ValueError, match="RL step: given no prompts at all") as raised:
        rollout_dropping_undecodable([], opening_rollout([]), set(), lambda line: None)
    assert not isinstance(raised.value, VideoDecodeError)
