"""Planning a tool round: per-block errors, max_parallel, window validation (SPEC §2, §3)."""

from __future__ import annotations

import pytest

from paravt_core.agent.dispatch import episode_end, plan_tool_round
from paravt_core.agent.tool_calls import parse_tool_calls


def _call(start: object, end: object, path: str = "v.mp4") -> str:
    arguments = f'{{"video_path": "{path}", "start_time": {start}, "end_time": {end}}}'
    return f'<tool_call>{{"name": "crop_video", "arguments": {arguments}}}</tool_call>'


def test_malformed_block_gets_an_error_and_its_siblings_run():
    text = _call(1, 3) + '<tool_call>{"name": "crop_video", "arguments": {</tool_call>' + _call(5, 8)
    plan = plan_tool_round(parse_tool_calls(text), duration=12.0, max_parallel=5)
    assert [call.status for call in plan] == ["run", "malformed", "run"]
    assert [call.window for call in plan] == [(1.0, 3.0), None, (5.0, 8.0)]
    assert plan[1].error.startswith("Error: malformed JSON")


def test_calls_past_max_parallel_get_an_error_and_malformed_blocks_do_not_count():
    text = "<tool_code>crop_video(</tool_code>" + "".join(_call(i, i + 1) for i in range(4))
    plan = plan_tool_round(parse_tool_calls(text), duration=12.0, max_parallel=2)
    assert [call.status for call in plan] == ["malformed", "run", "run", "over_limit", "over_limit"]
    assert "at most 2 crop_video calls" in plan[3].error
    assert [call.block_index for call in plan] == [0, 1, 2, 3, 4]


def test_each_line_of_a_tool_code_block_is_a_call_of_the_round():
    """SPEC §2: one <tool_code> block, one call per line; each counts toward max_parallel and
    gets its own response slot (block_index unique within the turn)."""
    lines = ['crop_video("v.mp4", 0, 2)', 'print(crop_video("v.mp4", 2, 4"))', "crop_video(v.mp4, 4, 6)",
             'crop_video("v.mp4", 6, 8)']
    text = _call(9, 10) + "<tool_code>" + "\n".join(lines) + "</tool_code>"
    blocks = parse_tool_calls(text)
    plan = plan_tool_round(blocks, duration=12.0, max_parallel=3)
    assert [call.status for call in plan] == ["run", "run", "run", "malformed", "over_limit"]
    assert [call.window for call in plan[:3]] == [(9.0, 10.0), (0.0, 2.0), (2.0, 4.0)]
    assert plan[3].error.startswith("Error: line 3 of the <tool_code> block:")
    assert [call.block_index for call in plan] == [0, 1, 2, 3, 4]
    assert sum(1 for block in blocks if not block.ok) == 1  # the rollout's parse_failures
    assert episode_end(blocks, cut_by_length=False, turn=0, max_turns=3) is None


@pytest.mark.parametrize(
    ("start", "end", "status", "window"),
    [
        (2, 30, "run", (2.0, 12.0)),  # end clamped to the duration
        (5, 5, "invalid_window", None),
        (7, 3, "invalid_window", None),
        (12, 20, "invalid_window", None),  # starts at the end of the video
        ('"00:02"', '"00:04.5"', "run", (2.0, 4.5)),
    ],
)
def test_window_validation(start, end, status, window):
    (call,) = plan_tool_round(parse_tool_calls(_call(start, end)), duration=12.0, max_parallel=5)
    assert call.status == status
    assert call.window == window
    assert (call.error is None) == (status == "run")


def test_invalid_windows_use_up_the_parallel_budget():
    text = _call(20, 30) + _call(1, 2) + _call(2, 3)
    plan = plan_tool_round(parse_tool_calls(text), duration=12.0, max_parallel=2)
    assert [call.status for call in plan] == ["invalid_window", "run", "over_limit"]


def test_model_written_video_path_does_not_matter():
    (call,) = plan_tool_round(parse_tool_calls(_call(1, 2, path="/etc/passwd; rm -rf /")), 12.0, 5)
    assert call.runs and call.window == (1.0, 2.0)


def test_num_frames_is_kept():
    body = '{"name": "crop_video", "arguments": {"video_path": "v", "start_time": 0, "end_time": 4, "num_frames": 3}}'
    (call,) = plan_tool_round(parse_tool_calls(f"<tool_call>{body}</tool_call>"), 12.0, 5)
    assert call.num_frames == 3


@pytest.mark.parametrize(
    ("text", "cut", "turn", "expected"),
    [
        (_call(0, 9)[:-20], True, 0, "length"),
        ("<answer>A</answer>", False, 0, "answer"),
        (_call(0, 9), False, 3, "max_turns"),
        (_call(0, 9), False, 2, None),
        ("<tool_call>not json</tool_call>", False, 0, None),  # a malformed block still gets its error response
    ],
)
def test_episode_end_after_a_generation(text, cut, turn, expected):
    """SPEC §3: a cut generation ends the episode, so does one without calls or past max_turns (3)."""
    assert episode_end(parse_tool_calls(text), cut, turn, max_turns=3) == expected


def test_hundreds_of_bad_blocks_get_max_parallel_errors_and_one_ignored_response():
    malformed = '<tool_call>{"name": "crop_video", "arguments": {</tool_call>'
    text = malformed * 150 + _call(1, 3) + malformed * 150 + "".join(_call(i, i + 1) for i in range(4))
    blocks = parse_tool_calls(text)
    assert len(blocks) == 305
    plan = plan_tool_round(blocks, duration=12.0, max_parallel=3)
    assert [call.status for call in plan] == ["malformed"] * 3 + ["run"] * 3 + ["ignored"]
    assert [call.block_index for call in plan[3:6]] == [150, 301, 302]
    ignored = plan[-1]
    assert ignored.block_index == 3
    assert ignored.error.startswith("Error: 299 further call blocks were ignored; at most 3 errors")
    # the two calls past max_parallel were folded in and still count as rejected calls
    assert ignored.ignored_calls == 2 and sum(call.rejected_calls for call in plan) == 2
    assert sum(1 for call in plan if not call.runs) == 3 + 1
