"""Table tests of crop_video call parsing and validation (SPEC §2)."""

from __future__ import annotations

import builtins
import json

import pytest

from paravt_core.agent.tool_calls import (
    CropCall,
    parse_time,
    parse_tool_calls,
    validate_crop_call,
)

ARGUMENTS_AS_TEXT = '{"video_path": "v.mp4", "start_time": 1, "end_time": 2.5}'
JSON_CALL = '{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 10, "end_time": 20}}'


def tool_call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def tool_code(body: str) -> str:
    return f"<tool_code>{body}</tool_code>"


def crop_json(**arguments: object) -> str:
    return tool_call(json.dumps({"name": "crop_video", "arguments": arguments}))


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        (tool_call(JSON_CALL), "json", CropCall(10.0, 20.0, None, "v.mp4")),
        # "arguments" written as a JSON string holding the object
        (
            tool_call(json.dumps({"name": "crop_video", "arguments": ARGUMENTS_AS_TEXT})),
            "json",
            CropCall(1.0, 2.5, None, "v.mp4"),
        ),
        (crop_json(video_path="v.mp4", start_time=0, end_time=4, num_frames=8), "json", CropCall(0.0, 4.0, 8, "v.mp4")),
        (
            tool_code('crop_video(video_path="v.mp4", start_time=10, end_time=20)'),
            "python",
            CropCall(10.0, 20.0, None, "v.mp4"),
        ),
        (tool_code('crop_video("v.mp4", 10, 20)'), "python", CropCall(10.0, 20.0, None, "v.mp4")),
        (tool_code('crop_video("v.mp4", 10, 20, 8)'), "python", CropCall(10.0, 20.0, 8, "v.mp4")),
        (tool_code("crop_video('v.mp4', start_time=5, end_time=7.5)"), "python", CropCall(5.0, 7.5, None, "v.mp4")),
        (
            tool_code('print(crop_video(video_path="v.mp4", start_time=10, end_time=20))'),
            "python",
            CropCall(10.0, 20.0, None, "v.mp4"),
        ),
        (
            tool_code('print(default_api.crop_video(video_path="v.mp4", start_time=3, end_time=4))'),
            "python",
            CropCall(3.0, 4.0, None, "v.mp4"),
        ),
        # stray quote before the final ")"
        (
            tool_code('crop_video(video_path="v.mp4", start_time=10, end_time=20")'),
            "python",
            CropCall(10.0, 20.0, None, "v.mp4"),
        ),
        (tool_code("print(crop_video('v.mp4', 10, 20'))"), "python", CropCall(10.0, 20.0, None, "v.mp4")),
        # a quote before ")" that closes a real string is left alone
        (tool_code('crop_video("v.mp4", "00:10", "00:20")'), "python", CropCall(10.0, 20.0, None, "v.mp4")),
        # MM:SS: 1*60 + 30 = 90; 2*60 + 5.5 = 125.5
        (tool_code('crop_video("v.mp4", "01:30", "2:05.5")'), "python", CropCall(90.0, 125.5, None, "v.mp4")),
        # MM:SS may exceed 59 minutes: 75*60 + 0 = 4500
        (tool_code('crop_video("v.mp4", "74:59", "75:00")'), "python", CropCall(4499.0, 4500.0, None, "v.mp4")),
        # HH:MM:SS: 1*3600 + 2*60 + 3 = 3723; 0 + 0 + 10 = 10
        (
            crop_json(video_path="v.mp4", start_time="00:00:10", end_time="1:02:03"),
            "json",
            CropCall(10.0, 3723.0, None, "v.mp4"),
        ),
        # numeric strings and integral frame counts given as text or float
        (tool_code('crop_video("v.mp4", "12.5", "20", num_frames="4")'), "python", CropCall(12.5, 20.0, 4, "v.mp4")),
        (tool_code('crop_video("v.mp4", 1, 2, num_frames=16.0)'), "python", CropCall(1.0, 2.0, 16, "v.mp4")),
        (tool_code('```python\nprint(crop_video("v.mp4", 1, 2))\n```'), "python", CropCall(1.0, 2.0, None, "v.mp4")),
        # close tag missing: the block runs to <|im_end|> or to the end of the text
        ("<tool_call>" + JSON_CALL, "json", CropCall(10.0, 20.0, None, "v.mp4")),
        ("<tool_call>" + JSON_CALL + "<|im_end|>", "json", CropCall(10.0, 20.0, None, "v.mp4")),
    ],
)
def test_parse_valid_call(text: str, kind: str, expected: CropCall) -> None:
    (block,) = parse_tool_calls("<think>look closer</think>\n" + text)
    assert block.error is None
    assert (block.index, block.kind, block.call) == (0, kind, expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (tool_call('{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 10'), "malformed JSON"),
        (tool_call('["crop_video", 1, 2]'), "JSON object"),
        (tool_call('{"name": "zoom", "arguments": {}}'), "unknown tool 'zoom'"),
        (tool_call('{"name": "crop_video", "arguments": [1, 2]}'), '"arguments" must be a JSON object'),
        (tool_call('{"name": "crop_video", "arguments": "not json"}'), 'malformed JSON in "arguments"'),
        (crop_json(video_path="v.mp4", start_time=10), "missing required argument(s) end_time"),
        (crop_json(start_time=1, end_time=2), "missing required argument(s) video_path"),
        (crop_json(video_path="v", start_time=1, end_time=2, fps=2), "unknown argument(s) fps"),
        (crop_json(video_path=7, start_time=1, end_time=2), "video_path must be a string"),
        (crop_json(video_path="v", start_time=True, end_time=2), "start_time must be a number"),
        (tool_code('crop_video("v.mp4", "1:75", "3:00")'), "below 60"),
        (tool_code('crop_video("v.mp4", "1:60:00", "2:00:00")'), "below 60"),
        (tool_code('crop_video("v.mp4", "ten", "20")'), "is not seconds, MM:SS or HH:MM:SS"),
        (tool_code('crop_video("v.mp4", "1:2:3:4", "20")'), "is not seconds, MM:SS or HH:MM:SS"),
        (tool_code('crop_video("v.mp4", -5, 20)'), "non-negative"),
        (tool_code('crop_video("v.mp4", "nan", 20)'), "finite"),
        (tool_code('crop_video("v.mp4", 1, 2, 0)'), "num_frames must be a positive integer"),
        (tool_code('crop_video("v.mp4", 1, 2, 2.5)'), "num_frames must be a positive integer"),
        (tool_code("crop_video(video_path=path, start_time=1, end_time=2)"), "video_path must be a literal"),
        (tool_code('crop_video("v", 1, 2, 3, 4)'), "at most 4 positional"),
        (tool_code('crop_video("v", 1, 2, start_time=3)'), "start_time given twice"),
        (tool_code("crop_video(**kwargs)"), "**kwargs"),
        (tool_code("crop_video(*args)"), "*args"),
        (tool_code('os.system("echo hi")'), "unknown tool 'system'"),
        (tool_code("x = crop_video(1, 2)"), "not a valid Python call"),
        (tool_code('crop_video("v", 1, 2) + 1'), "exactly one crop_video(...) call"),
        (tool_code(""), "not a valid Python call"),
        (tool_code('crop_video("v\x00", 1, 2)'), "not a valid Python call"),
        # hostile sizes give an error for the block, never an exception
        (crop_json(video_path="v", start_time=int("9" * 400), end_time=2), "start_time is too large"),
        (tool_call('{"name": "crop_video", "arguments": {"start_time": ' + "9" * 5000 + "}}"), "number is too long"),
        (tool_call("[" * 100_000), "nesting too deep"),
        (tool_code(f'crop_video("v", "{"9" * 5000}:00", 2)'), "is too long"),
    ],
)
def test_parse_malformed_call(text: str, message: str) -> None:
    (block,) = parse_tool_calls(text)
    assert block.call is None
    assert message in block.error


def test_malformed_block_keeps_valid_blocks_of_the_turn() -> None:
    text = (
        "<think>check two windows</think>\n"
        + tool_call('{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 0, "end_time": 5}}')
        + "\n"
        + tool_call('{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 5,, "end_time": 9}}')
        + "\n"
        + tool_code('crop_video("v.mp4", "00:30", "00:40")')
    )
    blocks = parse_tool_calls(text)
    assert [(b.index, b.kind, b.ok) for b in blocks] == [(0, "json", True), (1, "json", False), (2, "python", True)]
    assert blocks[0].call == CropCall(0.0, 5.0, None, "v.mp4")
    assert "malformed JSON" in blocks[1].error
    assert blocks[1].raw.startswith('{"name": "crop_video"')
    assert blocks[2].call == CropCall(30.0, 40.0, None, "v.mp4")


def test_tool_code_block_with_one_call_per_line_yields_each_call() -> None:
    """SPEC §2: a bare call, then a print(...) call with a stray quote before the final ")"."""
    body = 'crop_video(video_path="v.mp4", start_time=10, end_time=20)\nprint(crop_video("v.mp4", 30, 40"))'
    text = tool_call(JSON_CALL.replace("10", "50").replace("20", "60")) + "\n" + tool_code(body)
    blocks = parse_tool_calls(text)
    assert [(b.index, b.kind, b.call) for b in blocks] == [
        (0, "json", CropCall(50.0, 60.0, None, "v.mp4")),
        (1, "python", CropCall(10.0, 20.0, None, "v.mp4")),
        (2, "python", CropCall(30.0, 40.0, None, "v.mp4")),
    ]
    assert [b.raw for b in blocks[1:]] == body.splitlines()


def test_a_malformed_line_is_an_error_for_that_line_only() -> None:
    body = '```python\ncrop_video("v.mp4", 1, 2)\n\nprint(crop_video("v.mp4", start, 9))\n```'
    good, bad = parse_tool_calls(tool_code(body))
    assert (good.index, good.call) == (0, CropCall(1.0, 2.0, None, "v.mp4"))
    assert (bad.index, bad.call, bad.raw) == (1, None, 'print(crop_video("v.mp4", start, 9))')
    assert bad.error == "line 3 of the <tool_code> block: argument start_time must be a literal number or string"


def test_a_call_spanning_lines_stays_one_call_beside_other_lines() -> None:
    spanning = 'crop_video(\n    video_path="v.mp4",\n    start_time=5,\n    end_time=9)'
    assert [b.call for b in parse_tool_calls(tool_code(spanning))] == [CropCall(5.0, 9.0, None, "v.mp4")]
    body = f"# two windows\n{spanning}\ndefault_api.crop_video('v.mp4', 12, 14)"
    assert [b.call for b in parse_tool_calls(tool_code(body))] == [
        CropCall(5.0, 9.0, None, "v.mp4"), CropCall(12.0, 14.0, None, "v.mp4")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # one line, or lines that open no second call: one entry with the whole-block error
        ('crop_video("v", 1, 2) + 1', "exactly one crop_video(...) call"),
        ('crop_video("v.mp4", 1,\n 2', "not a valid Python call"),
        ('x = crop_video("v", 1, 2)\ny = 3', "not a valid Python call"),
    ],
)
def test_a_body_that_is_not_several_calls_stays_one_error(body: str, message: str) -> None:
    (block,) = parse_tool_calls(tool_code(body))
    assert block.call is None and block.raw == body
    assert message in block.error and "line" not in block.error.split(":")[0]


def test_unclosed_block_ends_at_next_opener() -> None:
    text = "<tool_call>" + JSON_CALL + "\n" + tool_call(JSON_CALL.replace("10", "30").replace("20", "40"))
    assert [b.call for b in parse_tool_calls(text)] == [
        CropCall(10.0, 20.0, None, "v.mp4"),
        CropCall(30.0, 40.0, None, "v.mp4"),
    ]


def test_no_blocks_and_tool_response_is_not_a_call() -> None:
    assert parse_tool_calls("<answer>B</answer>") == []
    assert parse_tool_calls("<tool_response>crop_video('v', 1, 2)</tool_response>") == []


def test_video_path_is_kept_as_text_and_never_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model-written path must not be opened")

    monkeypatch.setattr(builtins, "open", refuse_open)
    (block,) = parse_tool_calls(tool_code('crop_video("../../etc/passwd; rm -rf /", 1, 2)'))
    assert block.call.raw_video_path == "../../etc/passwd; rm -rf /"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(12, 12.0), (12.5, 12.5), ("7", 7.0), (" 0:09 ", 9.0), ("10:00", 600.0), ("02:00:00.25", 7200.25)],
)
def test_parse_time(value: object, seconds: float) -> None:
    assert parse_time(value) == seconds


@pytest.mark.parametrize(
    ("call", "duration", "expected"),
    [
        (CropCall(10.0, 20.0, None, "v.mp4"), 60.0, CropCall(10.0, 20.0, None, "v.mp4")),
        # end past the video is clamped to the duration; frame count and path are kept
        (CropCall(50.0, 90.0, 4, "x.mp4"), 60.0, CropCall(50.0, 60.0, 4, "x.mp4")),
        (CropCall(0.0, 59.9, None, "v.mp4"), 60.0, CropCall(0.0, 59.9, None, "v.mp4")),
    ],
)
def test_validate_accepts_and_clamps(call: CropCall, duration: float, expected: CropCall) -> None:
    result = validate_crop_call(call, duration)
    assert result.ok and result.error is None
    assert result.call == expected


@pytest.mark.parametrize(
    ("call", "duration", "message"),
    [
        (CropCall(20.0, 20.0, None, "v"), 60.0, "start_time (20 s) must be before end_time (20 s)"),
        (CropCall(30.0, 10.0, None, "v"), 60.0, "start_time (30 s) must be before end_time (10 s)"),
        (CropCall(60.0, 70.0, None, "v"), 60.0, "start_time (60 s) is not before the end of the video (60 s)"),
        (CropCall(75.5, 80.0, None, "v"), 60.0, "start_time (75.5 s) is not before the end of the video (60 s)"),
    ],
)
def test_validate_rejects(call: CropCall, duration: float, message: str) -> None:
    result = validate_crop_call(call, duration)
    assert not result.ok and result.call is None
    assert result.error == message
