"""The thread share under `rl.overlap: 1` (issue #65): a rank's threads split between the trainer
and its `hf` engine process (`rl/overlap.thread_share`), and the engine process really computing
at the count it is given, whatever its parent runs at."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.agent.hf_process import HFProcessEngine
from paravt_core.config import ConfigError, load_config
from paravt_core.rl.overlap import thread_share

TINY = Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml"


@pytest.mark.parametrize("rank,trainer,engine,share", [
    (2, None, None, (1, 1)), (1, None, None, (1, 1)), (4, None, None, (2, 2)), (3, None, None, (2, 1)),
    (4, None, 3, (1, 3)), (4, 3, None, (3, 1)), (2, 2, None, (2, 1)), (2, 1, 2, (1, 2)), (8, None, 1, (7, 1))])
def test_the_rank_threads_are_split_between_trainer_and_engine(rank, trainer, engine, share):
    assert thread_share(rank, trainer, engine) == share


def test_the_share_is_refused_without_overlap():
    with pytest.raises(ConfigError, match="rl.overlap_engine_threads splits a rank's threads .* rl.overlap is 0"):
        load_config(TINY, ["rl.overlap_engine_threads=1"])
    cfg = load_config(TINY, ["rl.overlap=1", "rl.overlap_engine_threads=1", "rl.overlap_trainer_threads=1"])
    assert (cfg.rl.overlap_trainer_threads, cfg.rl.overlap_engine_threads) == (1, 1)
    assert cfg.section_hash() == load_config(TINY, ["rl.overlap=1"]).section_hash()  # never in a key


def test_the_engine_process_computes_at_the_count_it_is_given(tiny_model_dir, monkeypatch):
    cfg = load_config(TINY, ["rl.overlap=1"])
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the parent's, which the child must not take
    seen = {}
    for threads in (1, 2):
        engine = HFProcessEngine(cfg, tiny_model_dir, "cpu", threads)
        try:
            seen[threads] = engine.threads()
        finally:
            engine.close()
    # torch, OpenMP and MKL are set to the count, and a matrix product keeps that many threads busy
    for threads, counts in seen.items():
        assert counts == {"torch": threads, "omp": threads, "mkl": threads, "busy": threads}, seen
