"""The one-step off-policy schedule (`rl/overlap.py`, issue #65): which weights generate which batch
and when they are pushed, whatever the timing; the knob's config checks and cache identity."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from paravt_core.config import ConfigError, PipelineConfig, load_config
from paravt_core.rl.overlap import Batch, behaviour_version, load_inflight, run_overlapped, save_inflight

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "conf/pipeline/tiny.yaml"


class Side:
    """An engine that holds a weight version and a trainer that bumps its own, logging events."""

    def __init__(self, trainer: int, engine: int, rollout_s: float = 0.0, train_s: float = 0.0):
        self.trainer, self.engine, self.rollout_s, self.train_s = trainer, engine, rollout_s, train_s
        self.events: list[tuple] = []
        self.generated: dict[int, int] = {}  # step -> the version that generated its batch
        self.rolling = threading.Event()

    def rollout(self, step: int) -> str:
        self.rolling.set()
        held = self.engine
        time.sleep(self.rollout_s)
        assert self.engine == held, "the engine's weights changed during a rollout"
        self.generated[step] = held
        self.rolling.clear()
        return f"batch{step}"

    def train(self, step: int, batch: Batch) -> dict[str, float]:
        assert batch.data == f"batch{step}" and self.trainer == step
        time.sleep(self.train_s)
        self.trainer += 1
        self.events.append(("train", step))
        return {}

    def push(self, version: int) -> None:
        assert not self.rolling.is_set(), "a push during a rollout"
        assert version == self.trainer, f"pushed as W({version}) while the trainer holds W({self.trainer})"
        self.engine = self.trainer
        self.events.append(("push", self.trainer))

    def run(self, start: int, stop: int, first: Batch | None = None) -> list[dict]:
        rows = []
        run_overlapped(start, stop, self.engine, first, self.rollout, self.train, self.push,
                       lambda step, row, following: rows.append(row))
        return rows


@pytest.mark.parametrize("rollout_s,train_s", [(0.0, 0.05), (0.05, 0.0)], ids=["train-slower", "rollout-slower"])
def test_each_batch_is_generated_by_the_version_the_schedule_names_whatever_the_timing(rollout_s, train_s):
    side = Side(0, 0, rollout_s, train_s)
    rows = side.run(0, 5)
    assert side.generated == {step: behaviour_version(step, 1) for step in range(5)} == {0: 0, 1: 0, 2: 1, 3: 2, 4: 3}
    # W(n) is pushed after step n (1-based) and before step n+2's batch is begun; none after the last step
    assert side.events == [("train", 0), ("push", 1), ("train", 1), ("push", 2), ("train", 2), ("push", 3),
                           ("train", 3), ("train", 4)]
    assert [row["behaviour_version"] for row in rows] == [0.0, 0.0, 1.0, 2.0, 3.0]
    slow = "time_trainer_idle_s" if rollout_s else "time_rollout_idle_s"
    assert all(row[slow] >= 0.03 for row in rows[1:-1])  # the faster side waits for the slower


def test_a_resumed_run_starts_from_the_saved_batch_and_a_wrong_engine_is_refused(tmp_path):
    side = Side(2, 2)  # resumed after 2 steps: trainer and engine hold W(2)
    side.run(2, 4, Batch(2, 1, 0.0, "batch2"))
    assert side.generated == {3: 2} and side.events == [("train", 2), ("train", 3)]
    with pytest.raises(RuntimeError, match=r"step 3's batch is made with W\(1\), but the engine holds W\(2\)"):
        Side(2, 2).run(2, 4)
    assert behaviour_version(7, 0) == 7 and behaviour_version(0, 1) == 0
    save_inflight(tmp_path, Batch(2, 1, 1.5, ["prompts", "episodes"]), rank=0)
    assert load_inflight(tmp_path, 2, 0).data == ["prompts", "episodes"]
    with pytest.raises(FileNotFoundError, match="step0000004-rank0.pt is missing"):
        load_inflight(tmp_path, 3, 0)


def test_overlap_is_hashed_only_when_set_and_refused_where_it_cannot_run():
    plain = PipelineConfig()
    assert PipelineConfig(rl={"overlap": 0}).section_hash("rl") == plain.section_hash("rl")
    assert PipelineConfig(rl={"overlap": 1}).section_hash("rl") != plain.section_hash("rl")
    # vLLM and SGLang servers name the weights of each reply (checked per batch)
    assert load_config(TINY, ["rl.overlap=1", "rl.rollout.engine=vllm",
                              "rl.rollout.vllm.url=http://127.0.0.1:9"]).rl.overlap == 1
    sglang = ["rl.overlap=1", "rl.rollout.engine=sglang", "rl.rollout.sglang.url=http://127.0.0.1:9"]
    assert load_config(TINY, [*sglang, "rl.rollout.sglang.placement=split"]).rl.overlap == 1
    # a colocated SGLang gives its memory to the training passes between rollouts: nothing to overlap with
    with pytest.raises(ConfigError, match=r"set rl.rollout.sglang.placement: split .* or rl.overlap: 0"):
        load_config(TINY, sglang)
    with pytest.raises(ConfigError, match="set rl.decoupled_ppo: true or rl.overlap: 0"):
        load_config(TINY, ["rl.overlap=1", "rl.decoupled_ppo=false"])
    with pytest.raises(ConfigError, match="rl.overlap"):
        load_config(TINY, ["rl.overlap=2"])


def _synchronous_rows(phases: list[tuple[float, float, float, float]]) -> list[dict]:
    keys = ("time_rollout_s", "time_reference_s", "time_train_s", "time_push_s")
    return [{"step": i + 1, "behaviour_version": float(i), **dict(zip(keys, p))} for i, p in enumerate(phases)]


def test_the_overlap_estimate_takes_a_synchronous_runs_medians_without_its_first_step():
    from paravt_core.rl.overlap import step_split

    rows = _synchronous_rows([(900.0, 90.0, 900.0, 90.0), (120.0, 30.0, 150.0, 25.0), (130.0, 32.0, 140.0, 20.0),
                              (110.0, 28.0, 160.0, 30.0)])
    split = step_split(rows, "metrics.jsonl")
    assert (split.rollout, split.reference, split.train, split.push, split.steps) == (120.0, 30.0, 150.0, 25.0, (2, 4))
    assert split.synchronous == 325.0  # every phase in turn
    assert split.overlapped == 205.0  # max(rollout 120, passes 180) + push 25
    rollout_bound = step_split(_synchronous_rows([(200.0, 10.0, 50.0, 5.0)]), "m")  # one step: it is used
    assert rollout_bound.overlapped == 205.0 and rollout_bound.steps == (1, 1)
    overlapped = [dict(row) for row in rows]
    overlapped[2]["behaviour_version"] = 1.0  # step 3 rolled out by W(1): an overlapped run's log
    with pytest.raises(ValueError, match=r"step 3 was rolled out by W\(1\), an overlapped run's"):
        step_split(overlapped, "m")
    old = [{k: v for k, v in row.items() if k != "time_push_s"} for row in rows]
    with pytest.raises(ValueError, match=r"step 1 has no \['time_push_s'\]"):
        step_split(old, "m")
    with pytest.raises(ValueError, match="holds no RL steps"):
        step_split([], "m")


def test_paravt_plan_prints_the_step_with_and_without_overlap_from_a_step_log(tmp_path, capsys):
    import json

    from paravt_core.cli import main

    log = tmp_path / "metrics.jsonl"
    rows = _synchronous_rows([(100.0, 30.0, 150.0, 25.0), (120.0, 30.0, 150.0, 25.0)])
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = str(REPO / "conf/pipeline/paravt_8b.yaml")
    assert main(["plan", "--config", config, "--gpus", "8", "--gpu-memory-gib", "79", "--step-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "RL policy pass" in out  # the memory plan, then the estimate
    assert f"medians of steps 2-2 of the synchronous run {log}" in out
    assert "| 120.00 | 30.00 | 150.00 | 25.00 | 325.00 | 205.00 | 0.63x |" in out
    log.write_text("not json\n")
    assert main(["plan", "--config", config, "--gpus", "8", "--gpu-memory-gib", "79", "--step-log", str(log)]) == 2
    assert f"paravt plan: --step-log: cannot read the step log {log}" in capsys.readouterr().err
