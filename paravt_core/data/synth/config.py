"""Sizes of the generated long-video world (`paravt synth`).

The defaults are the embedded CPU default of the pipeline: about a hundred short, small
videos that generate in seconds on two cores, enough for a tiny random-weight Qwen3-VL to
run the whole pipeline (SFT, PARA-GRPO and the seven-split evaluation of SPEC §7).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from paravt_core.seeds import Seed

# Where a planted empty video can go: the training videos, or one benchmark repo's videos
# (`benchmarks.GENERATED_SPLITS`; videomme_wsub shares videomme's).
VideoSet = Literal["train", "videomme", "longvideobench", "lvbench", "mlvu", "mmvu", "charades"]


class SynthConfig(BaseModel):
    """Everything `generate_world` needs besides the output folder.

    Durations are in seconds; `fps` is the frame rate the videos are written at. Events
    are short (2-4 s by default) so that a handful of uniform overview frames (SPEC §3)
    usually misses them, while a 1 fps crop of their window always shows them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    seed: Seed = 0
    train_videos: int = Field(48, ge=4, description="videos behind the SFT and RL shards (>= one per sentinel root)")
    eval_videos_per_split: int = Field(8, ge=1, description="held-out videos per benchmark repo")
    eval_rows_per_split: int = Field(12, ge=1, description="annotation rows per evaluation split")
    validation: bool = Field(
        False,
        description="also draw the validation split `videomme_val` (Video-MME rows, eval_rows_per_split of them, "
        "on eval_videos_per_split videos of its own, in a repo of its own): knobs are chosen on it, the test "
        "splits report. Off: the world is byte for byte what it was without the knob",
    )
    min_duration_s: float = Field(30.0, ge=30.0, le=300.0)
    max_duration_s: float = Field(120.0, ge=30.0, le=300.0)
    fps: float = Field(2.0, ge=1.0, le=4.0)
    width: int = Field(96, ge=64, le=128, multiple_of=2, description="even: yuv420p halves chroma")
    height: int = Field(64, ge=64, le=128, multiple_of=2)
    min_events: int = Field(1, ge=1, le=3)
    max_events: int = Field(3, ge=1, le=3, description="at most one event of each kind per video")
    min_event_s: float = Field(2.0, ge=1.0, le=10.0)
    max_event_s: float = Field(4.0, ge=1.0, le=10.0)
    overview_blind_frames: int = Field(
        4,
        ge=0,
        le=16,
        description="events avoid the instants of this many uniform overview frames (0: no avoidance)",
    )
    overview_blind_budgets: tuple[Annotated[int, Field(ge=1, le=64)], ...] = Field(
        (),
        description="further overview budgets K whose instants the (short) events avoid as well: with the budgets "
        "RL's nFrames gating draws (rl.gating.choices), no overview of any of them shows a short event (#35). "
        "Empty: overview_blind_frames only",
    )
    visible_event_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of videos whose first event is long (visible_event_min_s..visible_event_max_s) and "
        "placed anywhere, so a larger overview catches it more often than a smaller one (#35: 8-10 s events in "
        "36-46 s videos lay on 0 / 32 / 59 / 100 % of the 2 / 3 / 4 / 6-frame overviews of 495 drawn). A stable "
        "draw per video, "
        "taken only when the share is above 0, so other worlds keep their bytes",
    )
    visible_event_min_s: float = Field(8.0, ge=1.0, le=14.0)
    visible_event_max_s: float = Field(10.0, ge=1.0, le=14.0)
    sft_traces_per_video: int = Field(
        8, ge=1, description="distinct questions per video: 8 x 48 videos teach the tiny model the grammar (#4)"
    )
    rl_prompts_per_video: int = Field(2, ge=1)
    no_tool_share: float = Field(0.2, ge=0.0, le=1.0, description="share of SFT traces answered from the overview")
    max_calls_per_trace: int = Field(
        3, ge=1, le=5, description="parallel crop calls of a teacher trace (SPEC §3: max 5)"
    )
    max_crop_s: float = Field(16.0, ge=4.0, le=16.0, description="teacher windows fit 16 frames at 1 fps (SPEC §3)")
    event_kinds: tuple[Literal["shape", "digit", "motion"], ...] | None = Field(
        None,
        min_length=1,  # an empty tuple passed and failed in the data stage (random.choice of nothing)
        description="event kinds drawn (a kind may then repeat within a video; colours and shapes stay distinct). "
        "None: up to one event of each kind per video",
    )
    prompts: Literal["training", "eval"] = Field(
        "training",
        description="how the main-agent SFT rows and RL prompts ask: `training` our own system prompt and question "
        "layout (`prompts.SYSTEM_PROMPT`); `eval` exactly as the SPEC §7 evaluation asks in agentic_general mode "
        "(and direct mode for the direct_share rows), so a tiny model is evaluated on the prompts it learned (#15)",
    )
    direct_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of SFT traces asked in the evaluation's `direct` mode (prompts: eval only): no tools, "
        "the answer straight after a short reasoning over the overview",
    )
    final_reasoning: Literal["all", "relevant", "event"] = Field(
        "all",
        description="what a tool trace's final <think> quotes: `all` every crop's report, `relevant` only the "
        "report(s) naming the asked object, `event` only what the reports say of the asked event, without "
        "windows or times (a tiny model need not tell which response came from which call); then the answer",
    )
    question_topics: tuple[str, ...] | None = Field(
        None,
        description="event topics questions are drawn from (SFT, RL and evaluation; see questions.EVENT_TOPICS): "
        "a world a tiny vision tower can perceive asks only colour and position (#15). None: every topic",
    )
    colours: tuple[str, ...] | None = Field(
        None,
        description="the palette events are drawn in and colour options come from (world.COLOURS names, at least "
        "4: one per option). None: all seven",
    )
    option_order: Literal["shuffled", "canonical"] = Field(
        "shuffled",
        description="how multiple-choice options are listed: `shuffled` in random order (as benchmarks do); "
        "`canonical` in their topic's fixed order (colours alphabetically), so with a 4-colour palette every colour "
        "question lists the same options and the letter follows from the value (#15, questions.OptionStyle)",
    )
    crop_opening: Literal["shared", "own_token"] = Field(
        "shared",
        description="how a tool trace's first think opens (`traces.CROP_OPENING_TEXTS`): `shared` with one plan "
        "starting \"The\" as every no-crop think does and one starting \"Short\"; `own_token` with both starting "
        "\"Short\", which no no-crop think starts with, so the first token after the think prefix is the crop "
        "decision (#46 item 1)",
    )
    teacher_windows: Literal["target", "cover"] = Field(
        "target",
        description="what a teacher trace crops: `target` the grid segment(s) holding the event plus random "
        "others; `cover` every segment of the grid, so the crops always hold the evidence however little the "
        "overview shows (needs max_duration_s <= max_calls_per_trace * max_crop_s)",
    )
    subagent_traces_per_video: int = Field(
        0,
        ge=0,
        description="SFT rows per training video in which the sub-agent sees one grid segment's frames and "
        "writes its summary (SPEC §3), so tool responses carry the evidence (#15); 0: main-agent rows only",
    )
    rl_overview_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of RL prompts asking about the background, which the overview alone answers "
        "(not calling a tool is then right)",
    )
    second_wording: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of event questions (SFT, RL, evaluation) asked in their second wording "
        "(`questions.second_wording_text`: \"What is the colour of the star in this video?\"); 0: none",
    )
    second_wording_look: float = Field(
        1.0, ge=0.0, le=1.0,
        description="share of the agentic SFT traces of second-wording event questions in which the cold-start "
        "teacher crops; in the rest it answers from the overview without looking and is right by luck, as a "
        "rejection-sampled cold start keeps a lucky guess (`traces.unlooked_trace`). 1: it always looks",
    )
    teacher_budgets: tuple[Annotated[int, Field(ge=1)], ...] | None = Field(
        None,
        min_length=1,
        description="the overview-reading teacher (#46 item 2, docs/miniature.md \"World version 3\"): every "
        "main-agent SFT row carries its own overview budget K (`nframes` on its video item, drawn from these "
        "budgets by a stable hash), and the teacher of an agentic event question reads the K frames: it answers "
        "from them, naming what they show, when the asked event is on them (`traces.seen_trace`), and crops "
        "otherwise; direct rows say what the K frames show. None: the budget is drawn later by the SFT dataset "
        "(`video.sft_frame_choices`) and the teacher's look decision follows the question's wording",
    )
    skip_when_seen: float = Field(
        1.0, ge=0.0, le=1.0,
        description="with teacher_budgets: share of the agentic event questions whose asked event is on the row's "
        "K overview frames that the teacher answers from them (`traces.seen_trace`, a stable draw per slot); in "
        "the rest it crops anyway, as a cold start that calls tools by habit does (the paper's SFT model calls "
        "2.5 times per episode, SPEC §6). Where the frames do not show the event it always crops",
    )
    direct_check: bool = Field(
        False,
        description="with teacher_budgets: a direct-mode row (no tools) whose K overview frames show the asked "
        "event ends its think as the agentic rows do, with the answer named and the options checked "
        "(`traces.conclusion`), so the letter is copied from the check the model learned there; version 3's "
        "direct rows answered with a bare letter and direct mode scored 13 % (docs/miniature.md). False: the "
        "letter follows the think at once",
    )
    subagent_error_rate: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="share of the teacher's reports of an event in a window that name a wrong colour (a stable "
        "draw per video and window, the same in the sub-agent's own rows and in the main agent's tool responses, "
        "whose answer then follows the report): a sub-agent that is not always right, so tool paths carry a risk "
        "of their own (#46 item 2). 0: every report is the ground truth",
    )
    codec: Literal["libx264", "mpeg4"] = "libx264"
    empty_videos: tuple[VideoSet, ...] = Field(
        (),
        description="sets whose first video is written as a 0-byte file: a planted bad file, to see a run "
        "set it aside and go on (issue #12). Off (empty) for every real use",
    )
    revision: str = Field("main", pattern=r"^[A-Za-z0-9._-]+$", description="branch name written under refs/")

    @model_validator(mode="after")
    def _ranges_are_ordered(self) -> SynthConfig:
        if self.min_duration_s > self.max_duration_s:
            raise ValueError(f"min_duration_s {self.min_duration_s} > max_duration_s {self.max_duration_s}")
        if self.min_events > self.max_events:
            raise ValueError(f"min_events {self.min_events} > max_events {self.max_events}")
        if self.min_event_s > self.max_event_s:
            raise ValueError(f"min_event_s {self.min_event_s} > max_event_s {self.max_event_s}")
        if self.visible_event_min_s > self.visible_event_max_s:
            raise ValueError(f"visible_event_min_s {self.visible_event_min_s} > visible_event_max_s "
                             f"{self.visible_event_max_s}")
        if self.visible_event_share > 0 and self.visible_event_max_s + 2.0 > self.max_crop_s:
            raise ValueError(f"visible_event_max_s {self.visible_event_max_s} + 2 s of context must fit max_crop_s "
                             f"{self.max_crop_s}")
        if self.max_event_s + 2.0 > self.max_crop_s:
            raise ValueError(f"max_event_s {self.max_event_s} + 2 s of context must fit max_crop_s {self.max_crop_s}")
        if self.teacher_windows == "cover" and self.max_duration_s > self.max_calls_per_trace * self.max_crop_s:
            raise ValueError(
                f"teacher_windows cover: max_duration_s {self.max_duration_s} needs more than max_calls_per_trace "
                f"{self.max_calls_per_trace} windows of max_crop_s {self.max_crop_s}"
            )
        if self.question_topics is not None:
            from paravt_core.data.synth.vocab import EVENT_TOPICS

            known = sorted({t for topics in EVENT_TOPICS.values() for t in topics})
            unknown = sorted(set(self.question_topics) - set(known))
            if unknown or not self.question_topics:
                raise ValueError(f"question_topics {list(self.question_topics)}: unknown {unknown}; known: {known}")
        if self.colours is not None:
            from paravt_core.data.synth.vocab import COLOURS

            unknown = sorted(set(self.colours) - set(COLOURS))
            if unknown or len(set(self.colours)) != len(self.colours) or len(self.colours) < 4:
                raise ValueError(
                    f"colours {list(self.colours)}: give at least 4 distinct names of {sorted(COLOURS)}"
                    + (f" (unknown: {unknown})" if unknown else "")
                )
        if self.direct_share > 0 and self.prompts != "eval":
            raise ValueError("direct_share needs prompts: eval (direct rows ask in the evaluation's direct mode)")
        if self.no_tool_share + self.direct_share > 1:
            raise ValueError(f"no_tool_share {self.no_tool_share} + direct_share {self.direct_share} exceed 1")
        if self.second_wording_look < 1 and self.second_wording == 0:
            raise ValueError(
                f"second_wording_look {self.second_wording_look} applies to second-wording questions: "
                "set second_wording > 0 or leave second_wording_look at 1"
            )
        if self.teacher_budgets is not None and self.second_wording_look < 1:
            raise ValueError(
                f"second_wording_look {self.second_wording_look} is the wording teacher's look decision; with "
                "teacher_budgets the teacher looks when the overview does not show the event: leave it at 1"
            )
        if self.skip_when_seen < 1 and self.teacher_budgets is None:
            raise ValueError(f"skip_when_seen {self.skip_when_seen} applies to the overview-reading teacher: "
                             "set teacher_budgets or leave skip_when_seen at 1")
        if self.direct_check and self.teacher_budgets is None:
            raise ValueError("direct_check applies to the overview-reading teacher's direct rows: set "
                             "teacher_budgets or leave direct_check false")
        if self.subagent_error_rate > 0 and (self.colours is None or len(self.colours) != 4):
            raise ValueError(f"subagent_error_rate {self.subagent_error_rate} needs a palette of exactly 4 colours "
                             "(data.synth.colours), so every colour question lists the colour a report names")
        if len(set(self.empty_videos)) != len(self.empty_videos):
            raise ValueError(f"empty_videos {list(self.empty_videos)} names a set twice")
        return self
