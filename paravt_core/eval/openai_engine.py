"""The `openai` evaluation engine: the SPEC §3 / §7 episode over an OpenAI-compatible
chat-completions server (SGLang or vLLM serving the checkpoint on GPUs).

The `hf` engine works on token ids (`paravt_core.agent.rollout`); a chat-completions server
takes messages and renders them with the checkpoint's own chat template, so this module
plays the same protocol at the message level:
- The user turn holds the overview frames as base64 JPEG images, each preceded by its
  timestamp text "<12.0 seconds>" (SPEC §1), then the question text of the prompt mode.
  Evaluation prompts hold the tool schema in their system text (`prompting.py`); a prompt
  with `tools` sends them in the request's `tools` with `tool_choice: "none"`. Either way
  the model's `<tool_call>` text comes back as plain content, parsed here block by block
  (`parse_tool_calls`, SPEC §2).
- Each tool round is ONE user message, one `<tool_response>` block per call in call
  order (SPEC §3). `frames` mode: each crop's frames (timestamped images) followed by
  "<tool_response>\\nN frames from S.Ss to E.Es.\\n</tool_response>" (SPEC §7). `subagent`
  mode: the sub-agent requests of a turn (the window's frames and the SPEC §3 summary
  request) are sent concurrently, one thread per call. Responses are truncated to
  `tool_response_max_tokens` tokens with the model's tokenizer, as in the hf engine.
- Call planning (max_parallel, invalid windows, malformed blocks) is `plan_tool_round`,
  frame selection `CropRunner.frames`: the same code as the hf path.
- After the last allowed round the prompt's forced-answer turn is a separate user
  message, and the final request gets its token budget (SPEC §7).
- The think prefix (SPEC §3) is sent as a final assistant message "<think>\\n" with
  `continue_final_message: true` and `add_generation_prompt: false`, the chat parameters
  vLLM documents for continuing a message; a server without them cannot honour the
  prefix, so run prompt modes without one there, or check the server's version.
- At start, `check_server_rendering` holds the server's chat template and image handling
  to ours (a mismatch stops the run with the diff).
- Greedy decoding (temperature 0). Each HTTP request has a timeout (`timeout_s`,
  `eval.request_timeout_s`); timeouts, refused or dropped connections and HTTP
  408/429/500/502/503/504 are retried with exponential backoff; other errors fail at once
  with the server's message. A completion's retries are bounded in time, not only in count
  (issue #48 item 8): a second timed-out attempt gives up (the endpoint accepts
  connections and does not answer), and all attempts and backoff delays together end by
  the deadline `2 * timeout_s + the max_retries backoff delays` (`OpenAIChatClient.deadline_s`:
  1262 s at the defaults 600 s and 5 retries, 72 s at 5 s), each attempt's timeout cut to
  what is left of it. A reply that is not a chat completion (not HTTP, not JSON, or JSON
  of another shape) fails at once, naming the endpoint and showing the reply's start.
  Every failure is a `ChatError`; the evaluator stops the run on it (finished samples are
  kept, a re-run resumes), since the fault is the server's, not the sample's: scoring the
  sample 0 would lower the benchmark without a word.

Tested against a local stub server (tests/unit/test_eval_openai.py) and, in the `server`
tier (tests/server/, `make test-server`), against a real vLLM (its CPU build) serving a
tiny Qwen3-VL that calls tools. Not yet against SGLang, which has no CPU build.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, StrictInt, ValidationError

from paravt_core.agent.context import THINK_PREFIX, ChatRenderer
from paravt_core.agent.dispatch import (
    CropJob,
    CropRunner,
    CropSource,
    PlannedCall,
    ToolMode,
    episode_end,
    plan_tool_round,
)
from paravt_core.agent.media import clip_items, embedded_image, jpeg_image, with_frames
from paravt_core.agent.media import frame_items as timestamped_items
from paravt_core.agent.prompts import EpisodePrompt, frames_tool_text, subagent_instruction
from paravt_core.agent.tool_calls import parse_tool_calls
from paravt_core.config import RolloutConfig, VideoConfig
from paravt_core.eval.results import EpisodeOutcome
from paravt_core.video import Frames, VideoFile, sample_overview_frames

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# A timed-out attempt is tried once more (a server busy for a moment); a second timeout
# means the endpoint accepts connections and does not answer, and more tries only wait longer.
SILENT_ATTEMPTS = 2
REPLY_SHOWN = 200  # bytes of a malformed reply quoted in the error
Message = dict[str, Any]


class ChatError(RuntimeError):
    """A chat-completions request that failed for good; the message names the server."""


class _Retryable(Exception):
    """A failure worth another attempt (timeout, refused connection, 429 / 5xx)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class _ReplyMessage(BaseModel):
    content: str | None = None  # None when a server parsed the text into tool_calls itself


class _ReplyChoice(BaseModel):
    message: _ReplyMessage
    finish_reason: str | None = None


class _ReplyUsage(BaseModel):
    prompt_tokens: StrictInt | None = None


class _Completion(BaseModel):
    """The fields of an OpenAI chat-completions reply this client reads (others are ignored)."""

    choices: list[_ReplyChoice] = Field(min_length=1)
    usage: _ReplyUsage | None = None
    prompt_token_ids: list[StrictInt] | None = None  # vLLM's, with `return_token_ids`


@dataclass(frozen=True)
class ChatReply:
    text: str
    finish_reason: str  # "stop" | "length" | ...
    prompt_tokens: int | None = None  # the server's count of the rendered prompt (`usage`), when it says
    prompt_token_ids: tuple[int, ...] | None = None  # the rendered prompt's ids, when asked and the server says


class OpenAIChatClient:
    """A minimal chat-completions client (stdlib HTTP) with timeouts and retries.

    Args:
        base_url: the server's OpenAI API root, e.g. "http://127.0.0.1:30000/v1".
        model: the served model name sent as "model".
        timeout_s: per-request timeout (connect and each read).
        max_retries: retries after the first attempt for retryable failures.
        backoff_s: first retry delay; doubled each retry, capped at `max_backoff_s`.
        api_key: sent as a bearer token when given.
        sleep: the delay function (tests pass a recorder).

    One `complete` call ends by `deadline_s` (module docstring), whatever the server does
    short of dripping bytes slower than `timeout_s` apart.
    """

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 600.0, max_retries: int = 5,
                 backoff_s: float = 2.0, max_backoff_s: float = 60.0, api_key: str | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.api_key = api_key
        self.sleep = sleep

    @property
    def deadline_s(self) -> float:
        """The most one completion may take, retries included: `SILENT_ATTEMPTS` timeouts plus
        every backoff delay of `max_retries` retries."""
        return SILENT_ATTEMPTS * self.timeout_s + sum(self._backoff(retry) for retry in range(self.max_retries))

    def _backoff(self, retry: int) -> float:
        return min(self.backoff_s * 2**retry, self.max_backoff_s)

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Mapping[str, Any]] = (), continue_final_message: bool = False,
                 return_token_ids: bool = False) -> ChatReply:
        """One greedy completion of `messages`; with `return_token_ids`, asks for the rendered
        prompt's token ids (vLLM's `return_token_ids`; other servers ignore it)."""
        payload: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens,
                                   "temperature": 0.0, "top_p": 1.0}
        if return_token_ids:
            payload["return_token_ids"] = True
        if tools:
            payload["tools"], payload["tool_choice"] = [dict(tool) for tool in tools], "none"
        if continue_final_message:
            payload["continue_final_message"], payload["add_generation_prompt"] = True, False
        return self._reply(self._post(payload))

    def _reply(self, raw: bytes) -> ChatReply:
        """The reply's text and counts, or a `ChatError` quoting its start when it is not a chat completion."""
        try:
            data = _Completion.model_validate_json(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "the reply"
            raise ChatError(f"{self.url} answered with something that is not a chat completion ({where}: "
                            f"{error['msg']}); the reply begins {raw[:REPLY_SHOWN]!r}. Check that eval.endpoint is the "
                            "/v1 root of an OpenAI-compatible server (SGLang or vLLM, as `paravt eval serve` prints "
                            "it)") from None
        choice = data.choices[0]
        ids = tuple(data.prompt_token_ids) if data.prompt_token_ids is not None else None
        return ChatReply(choice.message.content or "", choice.finish_reason or "stop",
                         data.usage.prompt_tokens if data.usage else None, ids)

    def _post(self, payload: Mapping[str, Any]) -> bytes:
        """The body of a 200 reply to `payload`, retrying within `max_retries` and `deadline_s`."""
        body = json.dumps(payload).encode()
        started, timeouts = time.monotonic(), 0
        for attempt in range(self.max_retries + 1):
            timeout = max(min(self.timeout_s, self.deadline_s - (time.monotonic() - started)), 0.1)
            try:
                return self._post_once(body, timeout)
            except _Retryable as exc:
                if exc.timed_out and timeout == self.timeout_s:  # one cut short by the deadline proves nothing
                    timeouts += 1
                spent = time.monotonic() - started
                if timeouts == SILENT_ATTEMPTS:
                    raise ChatError(
                        f"{self.url} did not answer within {self.timeout_s:g} s, {timeouts} times ({spent:.0f} s in "
                        f"all): it accepts no request or answers none. Check that the server there is up and serving "
                        f"(`paravt eval serve` prints its endpoint), or raise eval.request_timeout_s if its "
                        f"generations take longer") from None
                delay = self._backoff(attempt)
                if attempt == self.max_retries or spent + delay >= self.deadline_s:
                    raise ChatError(
                        f"{self.url}: gave up after {attempt + 1} attempts: {exc} ({spent:.0f} s in all; the deadline "
                        f"of one request with its retries is {self.deadline_s:.0f} s: 2 x eval.request_timeout_s and "
                        "the backoff delays). Check that the server there is up and serving (`paravt eval serve` "
                        "prints its endpoint)") from None
                logger.warning("%s: %s; retry %d/%d in %.1f s", self.url, exc, attempt + 1, self.max_retries,
                               delay)
                self.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    def _post_once(self, body: bytes, timeout_s: float) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            if error.code in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {error.code}: {detail}") from error
            raise ChatError(f"{self.url} answered HTTP {error.code}: {detail}") from None
        except TimeoutError as error:  # a read timeout: connected, and no answer in time
            raise _Retryable(f"no answer within {timeout_s:g} s", timed_out=True) from error
        except urllib.error.URLError as error:
            timed_out = isinstance(error.reason, TimeoutError)  # the connect itself timed out
            raise _Retryable(f"{type(error.reason).__name__}: {error.reason}", timed_out=timed_out) from error
        except (ConnectionError, http.client.IncompleteRead) as error:  # dropped mid-reply: a restart, a crash
            raise _Retryable(f"the connection broke: {type(error).__name__}: {error}") from error
        except http.client.HTTPException as error:
            shown = str(error)[:REPLY_SHOWN]
            raise ChatError(f"{self.url} did not answer in HTTP ({type(error).__name__}: {shown!r}); check that "
                            "eval.endpoint names the server's HTTP port and /v1 root") from None


def frame_items(frames: Frames) -> list[Message]:
    """Content items of a clip on the server path: "<t seconds>" then the JPEG image, frame
    by frame (SPEC §1); the same rendering as the embedded path (`agent/media.py`)."""
    return clip_items(frames, jpeg_image)


def chat_messages(prompt: EpisodePrompt, overview: Frames) -> list[Message]:
    """The prompt's messages with its video item replaced by the overview's frame items."""
    return with_frames(prompt.messages, [overview], jpeg_image)


@dataclass
class _ChatEpisode:
    """A live episode: the chat so far, the next request's prefix and budget, counters."""

    prompt: EpisodePrompt
    source: CropSource
    messages: list[Message]
    prefix: str
    budget: int | None = None
    turns: int = 0
    tool_calls: int = 0
    parse_failures: int = 0
    rejected_calls: int = 0
    unanswered_calls: int = 0
    final_text: str = ""
    end_reason: str | None = None

    def request_messages(self) -> list[Message]:
        if not self.prefix:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]

    def outcome(self) -> EpisodeOutcome:
        assert self.end_reason is not None, "the final turn always ends an episode"
        return EpisodeOutcome(self.final_text, self.turns, self.tool_calls, self.parse_failures,
                              self.rejected_calls, self.unanswered_calls, self.end_reason)


class OpenAIAgent:
    """Plays one sample's episode over chat completions (module docstring).

    Args:
        client: the chat client.
        processor: the checkpoint's processor; only its tokenizer is used (tool-response
            truncation) and its chat template (the think prefix text).
        rollout_cfg: max_turns, max_parallel, max_new_tokens, think_prefix,
            subagent_max_new_tokens, tool_response_max_tokens.
        video_cfg: overview pixel bounds, crop fps and frame counts.
        tool_mode: "frames" or "subagent".
    """

    def __init__(self, client: OpenAIChatClient, processor: Any, rollout_cfg: RolloutConfig, video_cfg: VideoConfig,
                 tool_mode: ToolMode):
        self.client, self.cfg, self.video_cfg, self.tool_mode = client, rollout_cfg, video_cfg, tool_mode
        self.renderer = ChatRenderer(processor, rollout_cfg.think_prefix)

    def run(self, prompt: EpisodePrompt) -> EpisodeOutcome:
        with VideoFile(prompt.video_path) as video:
            cfg = self.video_cfg
            overview = sample_overview_frames(video, prompt.nframes or cfg.nframes, min_pixels=cfg.min_pixels,
                                              max_pixels=cfg.max_pixels)
            crops = CropRunner(self.renderer, cfg, "frames")  # window decoding only
            episode = _ChatEpisode(prompt, CropSource(0, video, overview.duration), chat_messages(prompt, overview),
                                   self.renderer.generation_prefix)
            for turn in range(self.cfg.max_turns + 1):
                plan = self._take_generation(episode, turn)
                if plan is None:
                    break
                self._tool_round(episode, plan, crops, turn)
        return episode.outcome()

    def _take_generation(self, episode: _ChatEpisode, turn: int) -> list[PlannedCall] | None:
        reply = self.client.complete(episode.request_messages(), max_tokens=episode.budget or self.cfg.max_new_tokens,
                                     tools=episode.prompt.tools, continue_final_message=bool(episode.prefix))
        episode.messages.append({"role": "assistant", "content": episode.prefix + reply.text})
        episode.final_text, episode.turns = reply.text, episode.turns + 1
        blocks = parse_tool_calls(reply.text)
        episode.parse_failures += sum(1 for block in blocks if not block.ok)
        episode.end_reason = episode_end(blocks, reply.finish_reason == "length", turn, self.cfg.max_turns)
        if episode.end_reason is None:
            return plan_tool_round(blocks, episode.source.duration, self.cfg.max_parallel)
        episode.unanswered_calls += sum(1 for block in blocks if block.ok)
        return None

    def _tool_round(self, episode: _ChatEpisode, plan: Sequence[PlannedCall], crops: CropRunner, turn: int) -> None:
        """One user message with every call's response in call order, then the forced turn."""
        frames = {call.block_index: crops.frames(CropJob(episode.source, call.window, call.num_frames))
                  for call in plan if call.runs}
        summaries = self._summaries(plan, frames) if self.tool_mode == "subagent" else {}
        content: list[Message] = []
        for call in plan:
            if not call.runs:
                text = call.error or ""
            elif self.tool_mode == "frames":
                content += frame_items(frames[call.block_index])
                text = frames_tool_text(len(frames[call.block_index].indices), *call.window)
            else:
                text = summaries[call.block_index]
            text = self.renderer.tool_response_text(text, self.cfg.tool_response_max_tokens)
            content.append({"type": "text", "text": f"<tool_response>\n{text}\n</tool_response>"})
        episode.messages.append({"role": "user", "content": content})
        episode.tool_calls += len(frames)
        episode.rejected_calls += sum(call.rejected_calls for call in plan)
        self._next_turn_prompt(episode, turn)

    def _next_turn_prompt(self, episode: _ChatEpisode, turn: int) -> None:
        forced = episode.prompt.forced_answer if turn == self.cfg.max_turns - 1 else None
        if forced is None:
            return
        episode.messages.append({"role": "user", "content": forced.text})
        episode.budget = forced.max_new_tokens
        episode.prefix = self.renderer.generation_prefix if forced.think_prefix else ""

    def _summaries(self, plan: Sequence[PlannedCall], frames: Mapping[int, Frames]) -> dict[int, str]:
        """The sub-agent summaries of a turn's calls, requested concurrently (parallel dispatch)."""
        runs = [call for call in plan if call.runs]
        if not runs:
            return {}

        def summarize(call: PlannedCall) -> str:
            content = [*frame_items(frames[call.block_index]),
                       {"type": "text", "text": subagent_instruction(*call.window)}]
            reply = self.client.complete([{"role": "user", "content": content}],
                                         max_tokens=self.cfg.subagent_max_new_tokens)
            return reply.text.strip()

        with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="paravt-subagent") as pool:
            texts = list(pool.map(summarize, runs))
        return {call.block_index: text for call, text in zip(runs, texts)}


class ServerRenderingMismatch(ChatError):
    """The server renders our messages into another prompt than our own rendering does."""


PROBE_SYSTEM = "You answer questions about videos. PARAVT-RENDERING-PROBE"


def rendering_probe(think_prefix: bool) -> tuple[list[Message], list[Message], list[np.ndarray]]:
    """(server messages, embedded messages, frames) of the probe `check_server_rendering` sends:
    a system turn, two timestamped frames and a question, as an episode's first turn."""
    frames = [np.full((64, 96, 3), value, dtype=np.uint8) for value in (40, 200)]
    timestamps = [0.5, 12.0]
    question = {"type": "text", "text": "What colour is the square? Answer with the option letter only."}

    def messages(image_item) -> list[Message]:
        turns = [{"role": "system", "content": PROBE_SYSTEM},
                 {"role": "user", "content": [*timestamped_items(timestamps, frames, image_item), question]}]
        return turns + ([{"role": "assistant", "content": THINK_PREFIX}] if think_prefix else [])

    return messages(jpeg_image), messages(embedded_image), frames


def rendering_diff(ours: Sequence[int], theirs: Sequence[int], tokenizer: Any, context: int = 12) -> str:
    """Where two renderings' token ids part: lengths, the first differing position and the
    text around it on each side, and the image-pad counts (the usual culprit: pixel bounds)."""
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    lo = max(0, first - context)

    def window(ids: Sequence[int]) -> str:
        return repr(tokenizer.decode(list(ids[lo:first + context])))

    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return (f"ours {len(ours)} ids, the server's {len(theirs)} ({len(theirs) - len(ours):+d}); first difference at "
            f"position {first}; image pads: ours {sum(i == pad for i in ours)}, the server's "
            f"{sum(i == pad for i in theirs)}\n  ours:     {window(ours)}\n  server's: {window(theirs)}")


def rendered_probe(processor: Any, think_prefix: bool = True,
                   pixel_bounds: tuple[int, int] | None = None) -> tuple[list[int], str]:
    """(token ids, text) of the rendering probe as `processor` renders it, its frames resized
    to `pixel_bounds` (min, max pixels) when given, else to the processor's own bounds."""
    _, embedded_messages, frames = rendering_probe(think_prefix)
    if think_prefix:
        text = processor.apply_chat_template(embedded_messages[:-1], tokenize=False, add_generation_prompt=True)
        text += THINK_PREFIX
    else:
        text = processor.apply_chat_template(embedded_messages, tokenize=False, add_generation_prompt=True)
    size = {} if pixel_bounds is None else {"size": {"shortest_edge": pixel_bounds[0],
                                                     "longest_edge": pixel_bounds[1]}}
    return [int(i) for i in processor(text=[text], images=frames, return_tensors="pt", **size)["input_ids"][0]], text


def check_server_rendering(client: OpenAIChatClient, processor: Any, think_prefix: bool = True,
                           pixel_bounds: tuple[int, int] | None = None) -> int:
    """Hold the server's prompt rendering to ours on one probe request; returns the token count.

    The probe is shaped like an episode's first request (system turn, two timestamped JPEG
    frames, question, and with `think_prefix` the continued `<think>\n` assistant prefix);
    ours is `processor.apply_chat_template` + the processor over the frames, the embedded
    path's layout. Every piece the server could render differently changes the ids: another
    chat template or system turn, image tokens per frame (its processor's resize bounds),
    timestamps, or a prefix it cannot continue (rendered as a closed assistant turn plus a
    new generation prompt).

    What is compared: the prompt's token ids, where the server returns them (vLLM's
    `return_token_ids`); else the number of prompt tokens it reports (`usage.prompt_tokens`
    of a 1-token completion), which is what SGLang's chat endpoint gives.

    `pixel_bounds` (min, max pixels per frame) renders ours with the trainer's bounds (SPEC §3)
    instead of the processor's own, so a server is held to the ids the policy was trained on;
    an exported checkpoint's processor carries them (`model.loading.pixel_bounded`).

    Raises:
        ServerRenderingMismatch: the ids (or counts) differ (the message holds where, and our
            rendering), or the server reports neither.
    """
    ours, text = rendered_probe(processor, think_prefix, pixel_bounds)
    server_messages = rendering_probe(think_prefix)[0]
    reply = client.complete(server_messages, max_tokens=1, continue_final_message=think_prefix, return_token_ids=True)
    advice = ("Serve the checkpoint with `paravt eval serve` (its own chat_template, and a processor config with "
              "video.min_pixels/max_pixels: a base model's own bounds upscale frames), with a server that supports "
              "continue_final_message.")
    if reply.prompt_token_ids is not None:
        if list(reply.prompt_token_ids) != ours:
            raise ServerRenderingMismatch(
                f"{client.url} renders the probe messages into other token ids than ours: "
                f"{rendering_diff(ours, reply.prompt_token_ids, processor.tokenizer)}\n{advice} Our rendering:\n{text}")
        return len(ours)
    if reply.prompt_tokens is None:
        raise ServerRenderingMismatch(f"{client.url} reports neither prompt_token_ids nor usage.prompt_tokens, so its "
                                      "chat template and image handling cannot be checked against ours; serve the "
                                      "checkpoint with SGLang or vLLM (`paravt eval serve`)")
    if reply.prompt_tokens != len(ours):
        raise ServerRenderingMismatch(
            f"{client.url} renders the probe messages into {reply.prompt_tokens} prompt tokens, our rendering into "
            f"{len(ours)} ({reply.prompt_tokens - len(ours):+d}): its chat template, image processing or think-prefix "
            f"handling differs from ours. {advice} Our rendering:\n{text}")
    return len(ours)
