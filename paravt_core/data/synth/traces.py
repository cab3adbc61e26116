"""Teacher traces in the response grammar of SPEC §2, written from the ground truth.

A tool trace is: `<think>` (what the overview shows and the plan), one or more PARALLEL
`<tool_call>` blocks on whole-second segments of a fixed grid, the one(s) the asked event
falls in and others elsewhere in the video; then one tool response per
call in call order (SPEC §3), each a factual summary of its window generated from the
manifest (what appears there, in temporal order, or that nothing notable happens); then
`<think>` over the evidence and `<answer>`. Windows are at most `max_crop_s` long, so a
1 fps crop of each fits the sub-agent's 16 frames (SPEC §3).

A no-tool trace answers a background question straight from the overview frames.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass

from paravt_core.data.synth.questions import Question, asked_object, option_text
from paravt_core.data.synth.world import DIGIT_WORDS, Event, VideoSpec, events_in_window

Window = tuple[int, int]


@dataclass(frozen=True)
class TeacherTrace:
    """The assistant turns and tool responses of one sample, before they become rows.

    `calls` and `tool_responses` are empty for a no-tool trace, whose whole answer is
    `final_turn`.
    """

    question: Question
    calls: tuple[Window, ...]
    first_turn: str | None
    tool_responses: tuple[str, ...]
    final_turn: str
    direct: bool = False  # asked in the evaluation's direct mode (no tools)
    nframes: int | None = None  # the row's overview budget K, when the teacher chose it (teacher_budgets)


def clock(seconds: float) -> str:
    """MM:SS.s, the time format of the summaries (SPEC §7 reads M:SS(.f))."""
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes):02d}:{rest:04.1f}"


def background_phrase(spec: VideoSpec) -> str:
    tint = spec.background.tint
    return "grey" if tint == "grey" else f"{tint}-tinted"


def indefinite(phrase: str) -> str:
    """"a red circle", "an orange star"."""
    return ("an " if phrase[:1] in "aeiou" else "a ") + phrase


def place_phrase(position: str) -> str:
    return "the centre" if position == "centre" else f"the {position} corner"


def event_clause(event: Event) -> str:
    """What happens in an event, without its times: "a red circle appears in the centre"."""
    if event.kind == "shape":
        return f"{indefinite(event.label)} appears in {place_phrase(event.position)}"
    if event.kind == "digit":
        return f"the digit {DIGIT_WORDS[event.digit]} is shown in {event.colour} in {place_phrase(event.position)}"
    return f"{indefinite(event.label)} moves from {event.direction} across the frame"


def describe_event(event: Event, start_s: float, end_s: float) -> str:
    """One sentence on an event seen from start_s to end_s."""
    return f"From {clock(start_s)} to {clock(end_s)} {event_clause(event)}."


# A sub-agent's report of a window without events. The background is not named: its tints
# share their names with the event colours (a "blue-tinted" background beside a blue star), so
# naming it would put a second colour word in every empty report the main agent reads (#15).
EMPTY_WINDOW = "Nothing notable happens in this window: only the plain background is visible."


@dataclass(frozen=True)
class Reporter:
    """What the teacher's sub-agent reports of an event (`SynthConfig.subagent_error_rate`): the
    ground truth, except for a stable share of the world's events, whose colour it names wrongly
    (another colour of the palette) in every window and every row that shows them. The sub-agent's
    own rows and the main agent's tool responses report alike, and the main agent's answer follows
    its report: a sub-agent that is not always right, so calling carries a risk (#46 item 2)."""

    error_rate: float = 0.0
    seed: int = 0
    palette: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg) -> Reporter:
        return cls(cfg.subagent_error_rate, cfg.seed, tuple(cfg.colours or ()))

    def event(self, spec: VideoSpec, event: Event) -> Event:
        """`event` as the sub-agent reports it."""
        if not self.error_rate:
            return event
        from paravt_core.data.synth.world import derived_rng

        rng = derived_rng(self.seed, "misreport", spec.video_id, event.start_frame, event.colour)
        if rng.random() >= self.error_rate:
            return event
        return dataclasses.replace(event, colour=rng.choice([c for c in self.palette if c != event.colour]))


TRUTH = Reporter()


def summarize_window(spec: VideoSpec, start_s: float, end_s: float, background: bool = False,
                     reporter: Reporter = TRUTH) -> str:
    """What a sub-agent watching [start_s, end_s) should report, in temporal order.

    `background`: an empty window's summary also names the background tint, as the tiny
    model's captioning corpus does (`model.pretrain`). Measured (#15, `paravt miniature caption-probe`,
    26 held-out events): captioning with the tint named learnt event colours for 100 %; the
    same 1200 steps without it, 31 %. Naming the tint in every empty clip is most of the
    colour signal that phase gets; the sub-agent's reports leave it out (EMPTY_WINDOW)."""
    events = events_in_window(spec, start_s, end_s)
    if not events:
        return EMPTY_WINDOW.replace("plain", f"plain {background_phrase(spec)}") if background else EMPTY_WINDOW
    return " ".join(describe_event(reporter.event(spec, e), max(e.start_s, start_s), min(e.end_s, end_s))
                    for e in events)


def segment_grid(spec: VideoSpec, length: int) -> list[Window]:
    """The video cut into consecutive whole-second segments of `length` s (the last one shorter)."""
    last = math.floor(spec.duration_s)
    return [(start, min(start + length, last)) for start in range(0, last, length)]


def _centred_window(spec: VideoSpec, event: Event) -> Window:
    """Whole seconds around the event with a second of context each side."""
    return max(0, math.floor(event.start_s) - 1), min(math.floor(spec.duration_s), math.ceil(event.end_s) + 1)


def plan_crop_windows(
    rng: random.Random, spec: VideoSpec, event_index: int, max_calls: int, max_crop_s: float
) -> tuple[Window, ...]:
    """1..max_calls disjoint windows in temporal order that together hold the event.

    The teacher scans the timeline: it cuts the video into `max_crop_s`-second segments
    (0-16, 16-32, ...) and crops the segment(s) the event falls in plus a few others, all in
    one turn. Grid-aligned windows keep the numbers a small model must write regular (end =
    start + segment length): with free-form windows the tiny model of the embedded default
    wrote start >= end or starts past the video's end in most of its failures (#4). An
    event that straddles two segments takes both; with `max_calls` 1 it gets one window
    centred on it instead.
    """
    event = spec.events[event_index]
    grid = segment_grid(spec, int(max_crop_s))
    target = [w for w in grid if w[0] < event.end_s and event.start_s < w[1]]
    if len(target) > max_calls:
        return (_centred_window(spec, event),)
    others = [w for w in grid if w not in target]
    extra = rng.sample(others, min(len(others), rng.randint(0, max_calls - len(target))))
    return tuple(sorted(target + extra))


def cover_crop_windows(spec: VideoSpec, max_calls: int, max_crop_s: float) -> tuple[Window, ...]:
    """Every segment of the `max_crop_s` grid: one parallel turn that scans the whole video,
    so the crops hold the evidence wherever the event is (`SynthConfig.teacher_windows: cover`)."""
    grid = segment_grid(spec, int(max_crop_s))
    if len(grid) > max_calls:
        raise ValueError(f"video {spec.video_id} ({spec.duration_s:.1f} s) needs {len(grid)} windows of "
                         f"{max_crop_s:g} s, more than max_calls {max_calls}")
    return tuple(grid)


def tool_call_block(video_name: str, window: Window) -> str:
    """`<tool_call>{"name": "crop_video", "arguments": {...}}</tool_call>` (SPEC §2)."""
    arguments = {"video_path": video_name, "start_time": window[0], "end_time": window[1]}
    return f"<tool_call>{json.dumps({'name': 'crop_video', 'arguments': arguments})}</tool_call>"


def conclusion(question: Question, spec: VideoSpec) -> str:
    """The last sentence of the final reasoning, naming the answer."""
    if question.qtype == "tvg":
        start, end = question.window
        return f"So the {spec.events[question.event_index].label} is visible from {start:.1f} to {end:.1f} seconds."
    if question.qtype == "mcq":
        return f"So the answer is {option_text(question.answer_text)}. {check_options(question)}"
    return f"So the answer is {question.answer_text}."


def check_options(question: Question) -> str:
    """The options read in order up to the one holding the answer, each set beside the value,
    then its letter: "Checking the options: A. Purple vs Cyan: different. B. Cyan vs Cyan: same.
    So the answer is option B."

    Naming the letter of the option that reads "Cyan" at once asks for a token that comes
    BEFORE the match ("B. Cyan"); the tiny Qwen3-VL never learned that lookup (measured on
    held-out reading rows: 17-32 % of letters, chance 25 %, while it copied the value from the
    notes 88 % of the time; docs/miniature.md). Judging "A. Purple, no." against
    a value named a line or more before it was not learned either: the tiny model said "no"
    at the first options and "yes" at the fourth whatever they read (`paravt miniature reading-probe`).
    So each line copies the option, then the value (from the line before it), and judges two
    spans a few tokens apart; the letter is copied from the line that says "same". The value
    is spelled as its option ("Top right"), so equal spans are equal tokens.
    """
    value = option_text(question.answer_text)
    checks = []
    for letter, option in zip(question.letters, question.options, strict=True):
        checks.append(f"{letter}. {option} vs {value}: {'same' if letter == question.answer else 'different'}.")
        if letter == question.answer:
            break
    return f"Checking the options: {' '.join(checks)} So the answer is option {question.answer}."


def think(text: str) -> str:
    return f"<think>\n{text}\n</think>"


# The two plans a tool trace opens with, by `SynthConfig.crop_opening` ({plural}: the windows).
# `shared`: the first starts with "The", as every no-crop think does (background, unlooked and
# direct traces), so the first token after the think prefix carries no decision and the
# decision falls on a later token, where the no-crop rows outnumber the crop rows (#46 item 1,
# docs/miniature.md "Why the SFT model does not crop"). `own_token`: both start with "Short",
# which no no-crop think starts with, so the first token is the decision.
CROP_OPENING_TEXTS = {
    "shared": ("The answer depends on a short event, which can fall between the overview frames. "
               "I will crop {plural} to look closer.",
               "Short events are easy to miss in the overview frames, so let me crop {plural} and check."),
    "own_token": ("Short events can fall between the overview frames. I will crop {plural} to look closer.",
                  "Short events are easy to miss in the overview frames, so let me crop {plural} and check."),
}


def tool_trace(
    rng: random.Random, spec: VideoSpec, question: Question, video_name: str, max_calls: int, max_crop_s: float,
    cover: bool = False, final_reasoning: str = "all", crop_opening: str = "shared", reporter: Reporter = TRUTH,
    nframes: int | None = None,
) -> TeacherTrace:
    """A one-round trace with parallel crops for an event question (`cover`: every grid segment).

    `final_reasoning` (`SynthConfig.final_reasoning`): what the final think says before its
    conclusion: `all` quotes every crop's report with its window, `relevant` only the
    report(s) of the window(s) holding the asked event, `event` names what the reports say of
    the asked event, without windows or times ("A crop reports that a red star appears in the
    centre."). `crop_opening`: which pair of plans opens the first think (`CROP_OPENING_TEXTS`).
    `reporter`: what the tool responses say (`Reporter`); the final think and answer follow them.
    `nframes`: the row's overview budget K, when the teacher knows it (`SynthConfig.teacher_budgets`)."""
    if cover:
        windows = cover_crop_windows(spec, max_calls, max_crop_s)
    else:
        windows = plan_crop_windows(rng, spec, question.event_index, max_calls, max_crop_s)
    # The plan names the windows ("16-32 s"): start and end side by side are an easier pattern
    # for a small model than across the call's JSON, which then copies them.
    spans = " and ".join(f"{s}-{e} s" for s, e in windows)
    plural = f"a window ({spans})" if len(windows) == 1 else f"{len(windows)} windows in parallel ({spans})"
    # Worded to stay true whatever the overview frame count K (SPEC §5 gating varies it).
    # The background is not named here either: a tint named like an event colour would be a
    # colour word the final answer could copy (see EMPTY_WINDOW).
    opening = rng.choice(CROP_OPENING_TEXTS[crop_opening]).format(plural=plural)
    first_turn = think(opening) + "\n" + "\n".join(tool_call_block(video_name, w) for w in windows)
    responses = tuple(summarize_window(spec, s, e, reporter=reporter) for s, e in windows)
    quoted = list(zip(windows, responses, strict=True))
    truth = spec.events[question.event_index]
    asked = reporter.event(spec, truth)
    question = reported_question(question, truth, asked)
    if final_reasoning == "event":
        evidence = f"A crop reports that {event_clause(asked)}."
    else:
        if final_reasoning == "relevant":  # only the report(s) of the window(s) the asked event is in
            quoted = [(w, r) for w, r in quoted if truth in events_in_window(spec, *w)]
        evidence = " ".join(f"The crop from {clock(s)} to {clock(e)} reports: {r}" for (s, e), r in quoted)
    final_turn = think(f"{evidence} {conclusion(question, spec)}") + f"\n<answer>{question.answer}</answer>"
    return TeacherTrace(question, windows, first_turn, responses, final_turn, nframes=nframes)


def reported_question(question: Question, truth: Event, reported: Event) -> Question:
    """`question` with the answer its sub-agent's report gives (`Reporter`): a colour question on
    a misreported event is answered with the reported colour's option; anything else is unchanged."""
    if reported == truth or question.topic != "colour":
        return question
    value = reported.colour
    if question.qtype == "mcq":
        letter = question.letters[question.options.index(option_text(value))]
        return dataclasses.replace(question, answer=letter, answer_text=value)
    return dataclasses.replace(question, answer=value, answer_text=value)


def no_tool_trace(spec: VideoSpec, question: Question) -> TeacherTrace:
    """A direct answer to a background question, which every overview frame answers."""
    reasoning = (
        f"The question is about the background, which every overview frame shows: a plain "
        f"{background_phrase(spec)} background that is brighter at the {spec.background.bright_side}. "
        f"No crop is needed. {conclusion(question, spec)}"
    )
    return TeacherTrace(question, (), None, (), think(reasoning) + f"\n<answer>{question.answer}</answer>")


def unlooked_trace(spec: VideoSpec, question: Question) -> TeacherTrace:
    """An agentic answer to an event question without a crop (`SynthConfig.second_wording_look`):
    a cold-start teacher that trusted the overview and was right, by luck where the overview
    misses the event (a short one) and by sight where it may show it (a long one, #35);
    rejection sampling keeps such a trace because its answer is right. The conclusion is the
    tool traces' own, so only the decision to look differs."""
    if question.event_index is None:
        raise ValueError("unlooked_trace answers an event question; background questions take no_tool_trace")
    reasoning = f"The overview frames should be enough to answer this. No crop is needed. {conclusion(question, spec)}"
    return TeacherTrace(question, (), None, (), think(reasoning) + f"\n<answer>{question.answer}</answer>")


def seen_trace(spec: VideoSpec, question: Question, nframes: int) -> TeacherTrace:
    """An agentic answer read off the row's K overview frames (`SynthConfig.teacher_budgets`): the
    asked event is on them, so the teacher names what they show and answers without a crop. The
    opening, "The overview frames show", is the skip plan; the crop plans open otherwise."""
    if question.event_index is None:
        raise ValueError("seen_trace answers an event question; background questions take no_tool_trace")
    reasoning = (f"{SEEN_OPENING} {event_clause(spec.events[question.event_index])}. No crop is needed. "
                 f"{conclusion(question, spec)}")
    return TeacherTrace(question, (), None, (), think(reasoning) + f"\n<answer>{question.answer}</answer>",
                        nframes=nframes)


SEEN_OPENING = "The overview frames show that"


def direct_trace(spec: VideoSpec, question: Question, hidden: bool = True, nframes: int | None = None,
                 seen: bool = False, check: bool = False) -> TeacherTrace:
    """An answer in the evaluation's direct mode (no tools): a short look at the overview, then
    the answer. `hidden`: the asked event lies off every overview the world's rows can be shown
    (`world.event_off_overviews`), so the trace says it is not in them; otherwise (a long event,
    #35) it says the overview may show it, which is true whatever the row's overview budget K,
    unknown here. The label is the ground truth either way (what a model answering from the
    overview alone is taught). `nframes` (the overview-reading teacher, `SynthConfig.teacher_budgets`):
    the row's K, whose frames show the event when `seen`; the think then says what they show, and
    with `check` (`SynthConfig.direct_check`) ends as `seen_trace` does, the answer named and the
    options checked. Where the frames miss the event there is nothing to check against."""
    if question.event_index is None:
        return dataclasses.replace(no_tool_trace(spec, question), direct=True, nframes=nframes)
    if nframes is not None:
        if seen:
            reasoning = f"{SEEN_OPENING} {event_clause(spec.events[question.event_index])}."
            if check:
                reasoning += f" {conclusion(question, spec)}"
        else:
            reasoning = (f"The overview frames show only the plain background; "
                         f"{asked_object(spec.events[question.event_index], question.topic)} is not in them.")
        return TeacherTrace(question, (), None, (), think(reasoning) + f"\n<answer>{question.answer}</answer>",
                            direct=True, nframes=nframes)
    # The event named as the question names it: by its label ("the red star") the answer was in
    # the reasoning, and a model answering blind learnt to name a colour and answer by it (#15).
    asked = asked_object(spec.events[question.event_index], question.topic)
    if hidden:
        reasoning = f"The overview frames show only the plain background; {asked} is not in them."
    else:
        reasoning = f"{asked[0].upper()}{asked[1:]} lasts long enough that the overview frames may show it."
    return TeacherTrace(question, (), None, (), think(reasoning) + f"\n<answer>{question.answer}</answer>", direct=True)
