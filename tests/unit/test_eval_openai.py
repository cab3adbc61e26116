"""The `openai` evaluation engine's chat client against a stub server on 127.0.0.1.

The stub is a real HTTP server started by the test: the client's retries, backoff and
timeouts run over real sockets. Episode-level behaviour (frames as timestamped images,
tool responses, forced answer) is in tests/integration/test_evaluator.py.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from paravt_core.agent.prompts import question_prompt
from paravt_core.eval.openai_engine import ChatError, OpenAIChatClient, chat_messages, frame_items
from paravt_core.video import Frames

Reply = tuple[int, Any, float]  # (HTTP status, JSON body, seconds to wait before answering)


class StubChatServer:
    """Answers POST /v1/chat/completions with `respond(request_number, body)`; records bodies."""

    def __init__(self, respond: Callable[[int, dict], Reply]):
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the name http.server calls
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,
                                        "authorization": self.headers.get("Authorization")})
                status, reply, delay = respond(len(server.requests), body)
                with lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                time.sleep(delay)
                with lock:
                    server.in_flight -= 1
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> StubChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(text: str, finish_reason: str = "stop") -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason}]}


def test_a_503_is_retried_with_backoff_then_the_reply_is_returned():
    def respond(number: int, body: dict) -> Reply:
        if number == 1:
            return 503, {"error": "server warming up"}, 0.0
        return 200, completion("<answer>B</answer>"), 0.0

    delays: list[float] = []
    with StubChatServer(respond) as server:
        client = OpenAIChatClient(server.base_url, "paravt-8b", backoff_s=0.5, sleep=delays.append, api_key="k")
        reply = client.complete([{"role": "user", "content": "Q"}], max_tokens=64)
    assert (reply.text, reply.finish_reason) == ("<answer>B</answer>", "stop")
    assert delays == [0.5]
    assert len(server.requests) == 2 and server.requests[1]["path"] == "/v1/chat/completions"
    body = server.requests[1]["body"]
    assert body["model"] == "paravt-8b" and body["max_tokens"] == 64
    assert body["temperature"] == 0.0 and body["top_p"] == 1.0  # greedy
    assert "tools" not in body and "continue_final_message" not in body
    assert server.requests[1]["authorization"] == "Bearer k"


def test_backoff_doubles_and_the_client_gives_up_naming_the_server():
    delays: list[float] = []
    with StubChatServer(lambda number, body: (503, {"error": "busy"}, 0.0)) as server:
        client = OpenAIChatClient(server.base_url, "m", max_retries=3, backoff_s=1.0, max_backoff_s=3.0,
                                  sleep=delays.append)
        with pytest.raises(ChatError, match=r"chat/completions: gave up after 4 attempts: HTTP 503"):
            client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
    assert delays == [1.0, 2.0, 3.0] and len(server.requests) == 4


def test_a_timed_out_request_is_retried():
    def respond(number: int, body: dict) -> Reply:
        return 200, completion(f"reply {number}"), (1.0 if number == 1 else 0.0)

    with StubChatServer(respond) as server:
        client = OpenAIChatClient(server.base_url, "m", timeout_s=0.3, sleep=lambda s: None)
        reply = client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
    assert reply.text == "reply 2" and len(server.requests) == 2


def test_a_client_error_fails_at_once_with_the_servers_message():
    with StubChatServer(lambda number, body: (400, {"error": "max_tokens too large"}, 0.0)) as server:
        client = OpenAIChatClient(server.base_url, "m", sleep=lambda s: pytest.fail("must not retry"))
        with pytest.raises(ChatError, match="HTTP 400.*max_tokens too large"):
            client.complete([{"role": "user", "content": "Q"}], max_tokens=10**9)
    assert len(server.requests) == 1


def test_a_refused_connection_is_retried_then_reported():
    with StubChatServer(lambda number, body: (200, completion("x"), 0.0)) as server:
        url = server.base_url
    delays: list[float] = []
    client = OpenAIChatClient(url, "m", max_retries=2, backoff_s=0.1, sleep=delays.append)
    with pytest.raises(ChatError, match="gave up after 3 attempts"):
        client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
    assert delays == [0.1, 0.2]



class RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with `reply` bytes and closes it,
    or, with `reply=None`, accepts connections and never answers (a hung or mis-aimed endpoint)."""

    def __init__(self, reply: bytes | None):
        self.reply, self.connections = reply, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by __exit__
                return
            self.connections += 1
            if self.reply is None:
                self.held.append(conn)
                continue
            conn.recv(1 << 16)
            conn.sendall(self.reply)
            conn.close()

    def __enter__(self) -> RawServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def http_200(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_an_endpoint_that_never_answers_is_given_up_after_two_timeouts_naming_it():
    delays: list[float] = []
    with RawServer(None) as server:
        client = OpenAIChatClient(server.base_url, "m", timeout_s=0.5, max_retries=5, backoff_s=0.1,
                                  sleep=delays.append)
        started = time.monotonic()
        with pytest.raises(ChatError) as failure:
            client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
        elapsed = time.monotonic() - started
    message = str(failure.value)
    assert server.base_url in message and "did not answer within 0.5 s, 2 times" in message
    assert "eval.request_timeout_s" in message  # what to do
    assert server.connections == 2 and delays == [0.1] and elapsed < 5.0


def test_retries_end_by_the_deadline_however_many_are_left():
    # Each attempt is answered 503 after 0.4 s: never a timeout, so only the deadline
    # (2 x 1.0 s + 20 x 0.01 s of backoff) stops 21 attempts (8.4 s) early.
    with StubChatServer(lambda number, body: (503, {"error": "overloaded"}, 0.4)) as server:
        client = OpenAIChatClient(server.base_url, "m", timeout_s=1.0, max_retries=20, backoff_s=0.01,
                                  max_backoff_s=0.01, sleep=lambda s: None)
        assert client.deadline_s == pytest.approx(2.2)
        started = time.monotonic()
        with pytest.raises(ChatError, match="gave up after .* attempts: .*the deadline of one request"):
            client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
        elapsed = time.monotonic() - started
    assert elapsed < 4.0 and len(server.requests) < 10


def test_the_default_deadline_is_two_timeouts_and_the_backoffs():
    assert OpenAIChatClient("http://x/v1", "m", timeout_s=600).deadline_s == 2 * 600 + 2 + 4 + 8 + 16 + 32
    assert OpenAIChatClient("http://x/v1", "m", timeout_s=5).deadline_s == 72


@pytest.mark.parametrize(("reply", "shown"), [
    (b"hello there\r\n\r\n", "hello there"),  # not HTTP
    (http_200(b"<html><body>Welcome</body></html>"), "<html><body>Welcome"),  # a web page
    (http_200(b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'), '{"choices"'),  # not UTF-8
    (http_200(b'{"choices": [{"message": {"content": 5}}]}'), '"content": 5'),  # content not text
    (http_200(b'{"choices": []}'), '{"choices": []}'),
    (http_200(b'[{"message": {"content": "a"}}]'), '[{"message"'),
    (http_200(b'{"choices": [{"message": {"content": "a"}}], "prompt_token_ids": ["x"]}'), '"prompt_token_ids"'),
    (http_200(b'{"choices": [{"message": {"content": "a"}}], "usage": {"prompt_tokens": "12"}}'), '"usage"'),
])
def test_a_reply_that_is_not_a_chat_completion_names_the_endpoint_and_shows_its_start(reply, shown):
    with RawServer(reply) as server:
        client = OpenAIChatClient(server.base_url, "m", timeout_s=5, sleep=lambda s: pytest.fail("must not retry"))
        with pytest.raises(ChatError) as failure:
            client.complete([{"role": "user", "content": "Q"}], max_tokens=8)
    message = str(failure.value)
    assert server.base_url in message and shown in message, message
    assert server.connections == 1

def test_tools_are_listed_but_not_parsed_and_the_think_prefix_is_continued():
    with StubChatServer(lambda number, body: (200, completion("ok"), 0.0)) as server:
        client = OpenAIChatClient(server.base_url, "m")
        prompt = question_prompt("q", "/v/clip.mp4", "What?")
        client.complete([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\n"}],
                        max_tokens=8, tools=prompt.tools, continue_final_message=True)
    body = server.requests[0]["body"]
    assert body["tools"][0]["function"]["name"] == "crop_video" and body["tool_choice"] == "none"
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def _frames(count: int) -> Frames:
    array = np.zeros((count, 28, 28, 3), dtype=np.uint8)  # [T, H, W, 3]
    array[:, :, :, 0] = np.arange(count)[:, None, None] * 40
    return Frames(array=array, timestamps=[2.0 * i + 0.5 for i in range(count)], indices=list(range(count)),
                  fps=2.0, duration=8.0, total_frames=16)


def test_frames_become_timestamp_texts_and_base64_jpeg_images():
    items = frame_items(_frames(3))
    assert [item["type"] for item in items] == ["text", "image_url"] * 3
    assert [items[i]["text"] for i in (0, 2, 4)] == ["<0.5 seconds>", "<2.5 seconds>", "<4.5 seconds>"]
    import base64
    import io

    from PIL import Image

    url = items[5]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert image.size == (28, 28) and abs(np.asarray(image)[..., 0].mean() - 80) < 4


def test_chat_messages_replace_the_video_item_with_the_overview():
    prompt = question_prompt("q", "/v/clip.mp4", "What?")
    (message,) = chat_messages(prompt, _frames(2))
    kinds = [item["type"] for item in message["content"]]
    assert kinds == ["text", "image_url", "text", "image_url", "text"]
    assert message["content"][-1]["text"].endswith("The video path for this video is: clip.mp4")


# --- whole episodes over the stub (tiny processor for truncation, the shared short clip) -------

SUBAGENT_MARK = "concise, factual summary"


def _calls(*windows: tuple[float, float]) -> str:
    blocks = [f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "clip.mp4", "start_time": {s}, '
              f'"end_time": {e}}}}}</tool_call>' for s, e in windows]
    return "Let me look closer.\n</think>\n" + "\n".join(blocks)


def _texts(message: dict) -> list[str]:
    content = message["content"]
    return [content] if isinstance(content, str) else [i["text"] for i in content if i["type"] == "text"]


def scripted(main_turns: list[str], delay: float = 0.0) -> Callable[[int, dict], Reply]:
    """Sub-agent requests get a summary naming their window; main turn k gets main_turns[k]."""
    def respond(number: int, body: dict) -> Reply:
        texts = [text for message in body["messages"] for text in _texts(message)]
        window = next((t for t in texts if SUBAGENT_MARK in t), None)
        if window is not None:
            return 200, completion(f"Summary: {window.split(' of a longer video')[0]}"), delay
        assistant_turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
        turn = assistant_turns - (1 if body.get("continue_final_message") else 0)
        return 200, completion(main_turns[min(turn, len(main_turns) - 1)]), delay
    return respond


def _sample(video, sample_id: str = "q1"):
    from paravt_core.eval.samples import EvalSample

    question = f"Question: What colour ({sample_id})?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
    return EvalSample(id=sample_id, split="videomme", video_path=video, question=question, answer="B", kind="mcq",
                      options=("red", "blue"))


def _settings(**eval_fields):
    from paravt_core.config import EvalConfig, RolloutConfig, VideoConfig
    from paravt_core.eval.evaluator import EvalSettings

    return EvalSettings(EvalConfig(nframes=4, max_new_tokens=300, **eval_fields), VideoConfig(nframes=4, max_pixels=6144),
                        RolloutConfig(subagent_max_new_tokens=40))


@pytest.mark.integration
def test_frames_episode_sends_timestamped_images_then_forces_the_answer(tiny_processor, short_video):
    from paravt_core.eval.evaluator import OpenAISampleRunner
    from paravt_core.eval.prompting import FORCED_MCQ, agentic_general_system

    with StubChatServer(scripted([_calls((2, 6), (0, 3)), "<answer>B</answer>"])) as server:
        runner = OpenAISampleRunner(OpenAIChatClient(server.base_url, "m"), tiny_processor,
                                    _settings(max_turns=1, tool_mode="frames"))
        ((_, outcome),) = list(runner.outcomes([_sample(short_video)]))
    first, final = (request["body"] for request in server.requests)

    assert first["continue_final_message"] and first["messages"][-1] == {"role": "assistant", "content": "<think>\n"}
    assert "tools" not in first and first["max_tokens"] == 300  # the schema is in the system text
    assert first["messages"][0] == {"role": "system", "content": agentic_general_system("parallel")}
    overview = first["messages"][1]["content"]
    assert [item["type"] for item in overview] == ["text", "image_url"] * 4 + ["text"]
    assert re.fullmatch(r"<\d+\.\d seconds>", overview[0]["text"])
    assert overview[-1]["text"].endswith("The video path for this video is: clip.mp4")

    assert "continue_final_message" not in final and final["max_tokens"] == 64  # forced answer: no think prefix
    *_, assistant, tool_turn, forced = final["messages"]
    assert assistant == {"role": "assistant", "content": "<think>\n" + _calls((2, 6), (0, 3))}
    assert forced == {"role": "user", "content": FORCED_MCQ.text}
    kinds = [item["type"] for item in tool_turn["content"]]
    assert kinds == ["text", "image_url"] * 4 + ["text"] + ["text", "image_url"] * 3 + ["text"]
    assert tool_turn["content"][8]["text"] == "<tool_response>\n4 frames from 2.0s to 6.0s.\n</tool_response>"
    assert tool_turn["content"][-1]["text"] == "<tool_response>\n3 frames from 0.0s to 3.0s.\n</tool_response>"
    assert (outcome.final_text, outcome.tool_calls, outcome.turns, outcome.end_reason) == ("<answer>B</answer>", 2, 2,
                                                                                          "answer")


@pytest.mark.integration
def test_subagent_episodes_run_concurrently_and_are_scored(tiny_processor, short_video, tmp_path):
    from paravt_core.eval.evaluator import OpenAISampleRunner, evaluate_split
    from paravt_core.eval.prompting import FORCED_MCQ

    respond = scripted([_calls((0, 4), (4, 8)), "</think>\n<answer>B</answer>"], delay=0.2)
    with StubChatServer(respond) as server:
        runner = OpenAISampleRunner(OpenAIChatClient(server.base_url, "m"), tiny_processor,
                                    _settings(max_turns=2, tool_mode="subagent", concurrency=2))
        run = evaluate_split("videomme", [_sample(short_video, "a"), _sample(short_video, "b")], runner, tmp_path,
                             progress=False)
    assert run.evaluated == 2 and run.summary["accuracy"] == 1.0 and run.summary["avg_tool_calls"] == 2.0
    bodies = [request["body"] for request in server.requests]
    subagent = [b for b in bodies if any(SUBAGENT_MARK in t for m in b["messages"] for t in _texts(m))]
    assert len(subagent) == 4 and all("tools" not in b and b["max_tokens"] == 40 for b in subagent)
    assert all(sum(i["type"] == "image_url" for i in b["messages"][0]["content"]) == 4 for b in subagent)
    finals = [b for b in bodies if len([m for m in b["messages"] if m["role"] == "assistant"]) == 2]
    assert len(finals) == 2
    tool_turn = finals[0]["messages"][-2]["content"]
    responses = [item["text"] for item in tool_turn if item["type"] == "text"]
    assert responses == [
        "<tool_response>\nSummary: These frames show the window 00:00 to 00:04 (4.0 seconds)\n</tool_response>",
        "<tool_response>\nSummary: These frames show the window 00:04 to 00:08 (4.0 seconds)\n</tool_response>"]
    assert not any(FORCED_MCQ.text in text for b in bodies for m in b["messages"] for text in _texts(m))
    assert server.max_in_flight >= 2  # samples, and the sub-agents of a turn, overlap


@pytest.mark.integration
def test_a_failed_sample_is_named_and_the_finished_ones_are_kept(tiny_processor, short_video, tmp_path):
    from paravt_core.eval.evaluator import OpenAISampleRunner, evaluate_split
    from paravt_core.eval.results import ResultsLog

    def respond(number: int, body: dict) -> Reply:
        texts = [text for message in body["messages"] for text in _texts(message)]
        if any("(bad)" in text for text in texts):
            return 400, {"error": "image too large"}, 0.3  # fails after the good sample is done
        return 200, completion("<answer>B</answer>"), 0.0

    with StubChatServer(respond) as server:
        runner = OpenAISampleRunner(OpenAIChatClient(server.base_url, "m"), tiny_processor,
                                    _settings(prompt_mode="direct", concurrency=2))
        with pytest.raises(ChatError, match="image too large") as failure:
            evaluate_split("videomme", [_sample(short_video, "good"), _sample(short_video, "bad")], runner, tmp_path,
                           progress=False)
    assert any("split videomme, sample(s) bad" in note for note in failure.value.__notes__)
    assert list(ResultsLog(tmp_path / "videomme.jsonl").load()) == ["good"]


def test_openai_client_settings_come_from_config_then_environment(monkeypatch, tmp_path):
    from paravt_core.config import EvalConfig
    from paravt_core.eval.stage import EvalError, _openai_client
    from paravt_core.refs import ArtifactRef

    model = ArtifactRef(kind="model", path=tmp_path, sha256="0" * 64)
    for name in ("PARAVT_EVAL_ENDPOINT", "PARAVT_EVAL_MODEL_NAME", "PARAVT_EVAL_TIMEOUT_S", "PARAVT_EVAL_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(EvalError, match="eval.endpoint"):
        _openai_client(model, EvalConfig(engine="openai"))
    client = _openai_client(model, EvalConfig(engine="openai", endpoint="http://127.0.0.1:30000/v1",
                                              served_model_name="paravt", request_timeout_s=5))
    assert (client.url, client.model, client.timeout_s) == ("http://127.0.0.1:30000/v1/chat/completions", "paravt", 5)
    monkeypatch.setenv("PARAVT_EVAL_ENDPOINT", "http://127.0.0.1:30001/v1")
    client = _openai_client(model, EvalConfig(engine="openai"))
    assert client.url == "http://127.0.0.1:30001/v1/chat/completions" and client.model == str(tmp_path)
    with pytest.raises(ValueError, match="endpoint"):
        EvalConfig(endpoint="127.0.0.1:30000")


@pytest.mark.integration
def test_an_undecodable_video_is_recorded_as_an_error_not_a_failed_split(tiny_processor, short_video, tmp_path):
    from paravt_core.eval.evaluator import OpenAISampleRunner, evaluate_split

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"")
    with StubChatServer(scripted(["<answer>B</answer>"])) as server:
        runner = OpenAISampleRunner(OpenAIChatClient(server.base_url, "m"), tiny_processor,
                                    _settings(prompt_mode="direct", concurrency=2))
        run = evaluate_split("videomme", [_sample(short_video, "good"), _sample(broken, "bad")], runner,
                             tmp_path / "results", progress=False)
    assert run.summary["n"] == 2 and run.summary["accuracy"] == 0.5
    assert [e["id"] for e in run.summary["errors"]] == ["bad"] and str(broken) in run.summary["errors"][0]["error"]


@pytest.mark.integration
@pytest.mark.parametrize("think_prefix", [True, False])
def test_a_server_rendering_other_prompt_tokens_stops_the_run_with_the_diff(tiny_processor, think_prefix):
    from paravt_core.eval.openai_engine import ServerRenderingMismatch, check_server_rendering, rendering_probe

    counted = {}

    def respond(number: int, body: dict) -> Reply:
        reply = completion("x")
        reply["usage"] = {"prompt_tokens": counted.get("tokens", 0), "completion_tokens": 1}
        return 200, reply, 0.0

    with StubChatServer(respond) as server:
        client = OpenAIChatClient(server.base_url, "m")
        counted["tokens"] = 10**6
        with pytest.raises(ServerRenderingMismatch, match=r"into 1000000 prompt tokens, our rendering into (\d+)"
                                                          r"[\s\S]*Our rendering:\n<\|im_start\|>system") as raised:
            check_server_rendering(client, tiny_processor, think_prefix)
        ours = int(re.search(r"our rendering into (\d+)", str(raised.value)).group(1))
        counted["tokens"] = ours
        assert check_server_rendering(client, tiny_processor, think_prefix) == ours
    body = server.requests[-1]["body"]
    assert body["max_tokens"] == 1 and bool(body.get("continue_final_message")) == think_prefix
    sent, _, _ = rendering_probe(think_prefix)
    assert body["messages"] == sent


@pytest.mark.integration
def test_a_server_returning_prompt_ids_is_held_to_ours_id_by_id(tiny_processor):
    from paravt_core.eval.openai_engine import ServerRenderingMismatch, check_server_rendering

    served = {}

    def respond(number: int, body: dict) -> Reply:
        return 200, {**completion("x"), "prompt_token_ids": served["ids"]}, 0.0

    with StubChatServer(respond) as server:
        client = OpenAIChatClient(server.base_url, "m")
        served["ids"] = [0]
        with pytest.raises(ServerRenderingMismatch):
            check_server_rendering(client, tiny_processor)
        # Our ids, served back as they are, then with one image pad fewer (a smaller pixel bound).
        pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        from paravt_core.eval.openai_engine import THINK_PREFIX, rendering_probe

        _, embedded, frames = rendering_probe(True)
        text = tiny_processor.apply_chat_template(embedded[:-1], tokenize=False, add_generation_prompt=True)
        ours = [int(i) for i in tiny_processor(text=[text + THINK_PREFIX], images=frames)["input_ids"][0]]
        served["ids"] = ours
        assert check_server_rendering(client, tiny_processor) == len(ours)
        fewer = list(ours)
        fewer.remove(pad)
        served["ids"] = fewer
        with pytest.raises(ServerRenderingMismatch, match=rf"ours {len(ours)} ids, the server's {len(ours) - 1} "
                                                          r"\(-1\); first difference at position \d+; image pads: "
                                                          rf"ours {ours.count(pad)}, the server's {ours.count(pad) - 1}"):
            check_server_rendering(client, tiny_processor)
    assert server.requests[-1]["body"]["return_token_ids"] is True


@pytest.mark.integration
def test_a_server_without_usage_cannot_be_checked(tiny_processor):
    from paravt_core.eval.openai_engine import ServerRenderingMismatch, check_server_rendering

    with StubChatServer(lambda number, body: (200, completion("x"), 0.0)) as server:
        with pytest.raises(ServerRenderingMismatch, match="reports neither prompt_token_ids nor usage.prompt_tokens"):
            check_server_rendering(OpenAIChatClient(server.base_url, "m"), tiny_processor)


def test_eval_serve_without_sglang_or_vllm_names_the_missing_piece(tmp_path, capsys, fake_checkpoint):
    import sys

    from paravt_core.cli import main

    model = fake_checkpoint(tmp_path / "ckpt", "w")
    serve = ["eval", "serve", "--model", str(model.path), "--port", "0"]  # 0: whatever else holds 30000 here
    # The project's own interpreter has neither server (they live in .venv-serve).
    assert main([*serve, "--python", sys.executable]) == 2
    err = capsys.readouterr().err
    assert "neither SGLang nor vLLM is installed for" in err and "make install-serve" in err
    assert main([*serve, "--python", sys.executable, "--server", "vllm"]) == 2
    assert "vllm is not installed for" in capsys.readouterr().err
    assert main([*serve, "--python", str(tmp_path / "no" / "python")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "make install-serve" in err


def test_eval_serve_commands_bind_loopback_and_name_the_model():
    from pathlib import Path

    from paravt_core.agent.server_launch import server_command

    for server in ("sglang", "vllm"):
        command = server_command(server, Path("/ckpt"), 30001, "paravt-8b-abc", python="/venv/bin/python")
        assert command[0] == "/venv/bin/python"
        assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "30001"
        assert command[command.index("--served-model-name") + 1] == "paravt-8b-abc" and "/ckpt" in command
        assert "--enforce-eager" not in command and "--max-model-len" not in command  # GPU: the model's own
        assert "--dtype" not in command  # GPU, no dtype asked: the checkpoint's torch_dtype
        # GPU: the dtype the evaluation's log-prob probe compares against (`model.dtype`)
        typed = server_command(server, Path("/ckpt"), 30001, "m", python="/venv/bin/python", dtype="bfloat16")
        assert typed[typed.index("--dtype") + 1] == "bfloat16"


def test_vllm_on_cpu_gets_float32_eager_a_bounded_context_and_its_cpu_settings(monkeypatch):
    from pathlib import Path

    from paravt_core.agent.server_launch import CPU_MAX_MODEL_LEN, CPU_STEP_TOKENS, server_command, server_env

    command = server_command("vllm", Path("/ckpt"), 30001, "m", cpu=True, dtype="bfloat16")
    assert command.count("--dtype") == 1 and command[command.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in command
    assert command[command.index("--max-model-len") + 1] == str(CPU_MAX_MODEL_LEN)
    # Prompts prefilled whole: a split prefill of a seeded request kills the CPU build's engine.
    assert command[command.index("--max-num-batched-tokens") + 1] == str(CPU_STEP_TOKENS) and CPU_STEP_TOKENS > 2048
    long = server_command("vllm", Path("/ckpt"), 30001, "m", cpu=True, max_model_len=131072)
    assert long[long.index("--max-num-batched-tokens") + 1] == "131072"
    assert "--max-num-batched-tokens" not in server_command("vllm", Path("/ckpt"), 30001, "m")  # GPU: vLLM's
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    env = server_env("vllm", cpu=True)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_OMP_THREADS_BIND" not in server_env("vllm", cpu=False)
