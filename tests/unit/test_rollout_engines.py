"""The rollout engines' records (`paravt_core/rollout_engines.py`, issue #63 item 1): one record
per `rl.rollout.engine`, read by the config, the RL ranks, the memory plan, the pre-flight, the
rehearsal and the cache identity; a toy engine added the documented way reaches each of them, and
no module outside the records compares the engine to a name."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paravt_core import cache_identity
from paravt_core.config import ConfigError, load_config
from paravt_core.rollout_engines import ROLLOUT_ENGINES, RolloutEngineSpec, register_rollout_engine, resolve

REPO = Path(__file__).resolve().parents[2]
CONFIG_8B = REPO / "conf/pipeline/paravt_8b.yaml"
TINY = REPO / "conf/pipeline/tiny.yaml"


def test_every_record_names_callables_that_exist():
    assert list(ROLLOUT_ENGINES) == ["hf", "sglang", "vllm"]
    for spec in ROLLOUT_ENGINES.values():
        for hook in ("backend", "plan", "check", "preflight"):
            ref = getattr(spec, hook)
            assert ref is None or callable(resolve(ref)), (spec.name, hook)
    assert [n for n, s in ROLLOUT_ENGINES.items() if s.server] == ["sglang", "vllm"] == list(
        cache_identity.server_location())


def test_a_name_registered_twice_or_a_malformed_reference_is_refused():
    with pytest.raises(ValueError, match="'vllm' is registered twice"):
        register_rollout_engine(RolloutEngineSpec("vllm", backend="m:f", plan="m:f"))
    assert register_rollout_engine(ROLLOUT_ENGINES["vllm"]) is ROLLOUT_ENGINES["vllm"]  # a reloaded config's
    with pytest.raises(ValueError, match="is not 'package.module:function'"):
        resolve("paravt_core.plan.memory_plan")


@pytest.mark.parametrize("value", ["nope", "HF", "3", "null", "[hf]", "{hf: 1}"])
def test_an_unknown_engine_is_refused_naming_the_registered_ones(value):
    """In the words pydantic gave when the field was a Literal of the three names."""
    with pytest.raises(ConfigError, match=r"rl\.rollout\.engine: Input should be 'hf', 'sglang' or 'vllm'$"):
        load_config(TINY, [f"rl.rollout.engine={value}"])


# --- no engine named outside its record ---------------------------------------------------------

def _engine_of_rollout(node: ast.expr) -> bool:
    """`<...rollout...>.engine`, `ro.engine`, or a local `engine`: the configured rollout engine."""
    if isinstance(node, ast.Name):
        return node.id == "engine"
    return isinstance(node, ast.Attribute) and node.attr == "engine" and (
        "rollout" in ast.unparse(node.value) or ast.unparse(node.value) == "ro")


def _names(node: ast.expr) -> set[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def engine_comparisons(root: Path, names: set[str], folders: tuple[str, ...] = ("paravt_core", "tasks", "flows")
                       ) -> list[str]:
    """`file:line` of every comparison of the rollout engine with one of `names`, and of every
    table keyed by two or more of them (`{"sglang": ..., "vllm": ...}[engine]`)."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, ast.Compare):
                    sides = [node.left, *node.comparators]
                    if any(_engine_of_rollout(s) for s in sides) and any(_names(s) & names for s in sides):
                        found.append(f"{relative}:{node.lineno}")
                elif isinstance(node, ast.Dict):
                    keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                    if len(keys & names) > 1:
                        found.append(f"{relative}:{node.lineno}")
    return found


def test_no_module_compares_the_rollout_engine_to_a_name():
    assert engine_comparisons(REPO, set(ROLLOUT_ENGINES)) == []


def test_the_scan_finds_a_comparison(tmp_path: Path):
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "probe.py").write_text(
        "def f(cfg, ro):\n    if cfg.rl.rollout.engine == 'vllm':\n        return 1\n"
        "    return ro.engine in ('hf', 'sglang') or cfg.eval.engine == 'hf'\n\n\n"
        "def g(engine, ro):\n    return engine != 'hf' and {'sglang': ro.sglang, 'vllm': ro.vllm}[engine]\n")
    assert engine_comparisons(tmp_path, set(ROLLOUT_ENGINES), ("flows",)) == [
        "flows/probe.py:2", "flows/probe.py:4", "flows/probe.py:8", "flows/probe.py:8"]


# --- a toy engine added the documented way ------------------------------------------------------

# The toy engine's own module: its client and the callables its record names.
TOY_MODULE = textwrap.dedent('''
    from paravt_core.config import ConfigError
    from paravt_core.plan import StageMemory
    from paravt_core.preflight import Check
    from paravt_core.rl.rollout_engine import RolloutBackend


    class ToyEngine:
        def __init__(self, where):
            self.where = where

        def generate(self, requests, params):
            return []

        def update_weights(self, weights):
            pass


    def backend(cfg, init_model, processor, device, rank, world, staging_dir, init_sha256):
        return RolloutBackend(ToyEngine(f"{init_model.name} on {device}, rank {rank} of {world}"),
                              pushes_weights=rank == 0, world=world)


    def check(cfg):
        toy = cfg.rl.rollout.toy
        if toy.url is None and not toy.gpus:
            raise ConfigError("rl.rollout.toy: no url to connect to and no gpus to launch on")


    def plan(cfg, shape, budget, gpu_bytes):
        toy = cfg.rl.rollout.toy
        pool = int(toy.pool_fraction * gpu_bytes)
        return ([StageMemory("RL rollout server (toy)", f"server GPU(s) {list(toy.gpus)}",
                             (("weights", 2 * shape.params),), pool, "raise rl.rollout.toy.pool_fraction")],
                ["the toy server is a toy"])


    def preflight(cfg, probes):
        return [Check("toy server", probes.has_module("toy-python", "toy"), "toy for toy-python", "install toy")]
''')

# The edit to `config.py`: the toy's server section and its record beside the others, and the
# section's field in `RolloutConfig`. Run in a fresh interpreter on a copy of the file loaded in
# its place, before anything reads the config, as the edit would be.
TOY_RUN = textwrap.dedent('''
    import hashlib, importlib.util, json, sys
    from pathlib import Path

    tmp, repo = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path[:0] = [str(tmp), str(repo / "tests" / "unit")]
    source = (repo / "paravt_core" / "config.py").read_text()
    section = (
        "class ToyServerConfig(_Section):\\n"
        "    url: str | None = Field(None, pattern=r'^https?://')\\n"
        "    placement: Literal['colocated', 'split'] = 'colocated'\\n"
        "    gpus: tuple[int, ...] = ()\\n"
        "    pool_fraction: float = 0.5\\n\\n\\n"
        "register_rollout_engine(RolloutEngineSpec('toy', backend='toy_rollout:backend', plan='toy_rollout:plan', "
        "check='toy_rollout:check', preflight='toy_rollout:preflight', server=True))\\n\\n\\n")
    for marker, edit in (("class RolloutConfig(_Section):", section + "class RolloutConfig(_Section):"),
                         ("    vllm: VLLMServerConfig = VLLMServerConfig()\\n",
                          "    vllm: VLLMServerConfig = VLLMServerConfig()\\n    toy: ToyServerConfig = ToyServerConfig()\\n"),
                         ("Path(__file__).resolve().parents[1]", repr(str(repo)))):
        assert source.count(marker) == 1, marker
        source = source.replace(marker, edit)
    copy = tmp / "config.py"
    copy.write_text(source)
    spec = importlib.util.spec_from_file_location("paravt_core.config", copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules["paravt_core.config"] = module
    spec.loader.exec_module(module)

    from test_cache_identity import classification_problems
    from paravt_core import cache_identity, plan
    from paravt_core.config import ConfigError, load_config
    from paravt_core.preflight import Probes
    from paravt_core.rehearsal import expected_roles
    from paravt_core.rl.rollout_engine import build_rollout_engine, check_rollout_engine

    config_8b = repo / "conf/pipeline/paravt_8b.yaml"
    out = {}
    def refusal(path, overrides):
        try:
            load_config(path, overrides)
        except (ConfigError, ValueError) as exc:
            return str(exc).splitlines()[-1]
    out["unknown"] = refusal(config_8b, ["rl.rollout.engine=nope"])
    out["url_of_another"] = refusal(config_8b, ["rl.rollout.toy.url=http://127.0.0.1:1"])
    out["trainers_gpu"] = refusal(config_8b, ["rl.rollout.engine=toy", "rl.rollout.toy.placement=split",
                                              "rl.rollout.toy.gpus=[3]"])
    toy = ["rl.rollout.engine=toy", "rl.rollout.toy.placement=split", "rl.rollout.toy.gpus=[7]"]
    cfg = load_config(config_8b, toy)
    out["engine"], out["gpus"] = cfg.rl.rollout.engine, list(cfg.rl.rollout.toy.gpus)

    try:
        check_rollout_engine(load_config(config_8b, ["rl.rollout.engine=toy"]))
    except ConfigError as exc:
        out["check"] = str(exc)
    check_rollout_engine(cfg)
    backend = build_rollout_engine(cfg, tmp / "init", None, "cuda:0", 1, 7, tmp / "weights", "0" * 64)
    out["backend"] = [type(backend.engine).__name__, backend.engine.where, backend.pushes_weights]

    memory = plan.memory_plan(cfg, plan.QWEN3_VL_8B, 8, 80 * plan.GIB)
    out["stages"] = [[s.stage, s.where] for s in memory.stages]
    out["policy_parts"] = [name for name, _ in memory.stages[2].parts]
    out["problems"], out["gpus_needed"] = list(memory.problems), plan.gpus_needed(cfg)
    out["unplanned"] = list(plan.memory_plan(load_config(config_8b, [*toy, "rl.rollout.toy.url=http://h:1"]),
                                             plan.QWEN3_VL_8B, 8, 80 * plan.GIB).unplanned)

    probes = Probes(python_version=lambda: (3, 12, 3), cuda=lambda: None, driver_version=lambda: None,
                    free_disk=lambda path: 0, has_module=lambda python, name: name != "toy",
                    free_shm=lambda: None)
    from paravt_core import preflight
    out["preflight"] = [[c.name, c.ok, c.fix] for c in preflight._packages(cfg, probes)]
    out["roles"] = [r for r in expected_roles(cfg) if "rollout" in r]
    out["roles_at_url"] = [r for r in expected_roles(load_config(config_8b, [*toy, "rl.rollout.toy.url=http://h:1"]))
                           if "rollout" in r]

    out["classification"] = classification_problems()
    def keys(c):
        return [c.section_hash(), cache_identity.rl_run_config(c).section_hash("rl", "video", "run"),
                hashlib.sha256(cache_identity.rollout_json(c.rl.rollout).encode()).hexdigest()[:16]]
    out["keys"] = {name: keys(load_config(repo / f"conf/pipeline/{name}.yaml")) for name in ("paravt_8b", "tiny")}
    out["toy_keys"] = [keys(cfg), keys(load_config(config_8b, ["rl.rollout.engine=toy", "rl.rollout.toy.url=http://h:1"])),
                       keys(load_config(config_8b, [*toy, "rl.rollout.toy.pool_fraction=0.7"]))]
    print(json.dumps(out))
''')


def _keys(cfg) -> list[str]:
    return [cfg.section_hash(), cache_identity.rl_run_config(cfg).section_hash("rl", "video", "run"),
            hashlib.sha256(cache_identity.rollout_json(cfg.rl.rollout).encode()).hexdigest()[:16]]


def test_a_toy_engine_added_the_documented_way_reaches_every_reader(tmp_path):
    (tmp_path / "toy_rollout.py").write_text(TOY_MODULE)
    done = subprocess.run([sys.executable, "-c", TOY_RUN, str(tmp_path), str(REPO)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    # the config: accepted, refused by name, its server section validated as the others'
    assert out["engine"] == "toy" and out["gpus"] == [7]
    assert out["unknown"].endswith("rl.rollout.engine: Input should be 'hf', 'sglang', 'vllm' or 'toy'")
    assert "rl.rollout.toy.url is set but rl.rollout.engine is vllm" in out["url_of_another"]
    assert "rl.rollout.toy.gpus [3] include GPU(s) [3], which the trainers take" in out["trainers_gpu"]
    # the RL ranks: its check before any worker, its backend on each rank
    assert out["check"] == "rl.rollout.toy: no url to connect to and no gpus to launch on"
    assert out["backend"] == ["ToyEngine", "init on cuda:0, rank 1 of 7", False]
    # the memory plan: its rows and problems, its server's GPU counted, no copy on the trainers
    assert ["RL rollout server (toy)", "server GPU(s) [7]"] in out["stages"]
    assert not any("vLLM" in stage or "SGLang" in stage for stage, _ in out["stages"])
    assert out["problems"] == ["the toy server is a toy"] and out["gpus_needed"] == 8
    assert not any("rollout copy" in part for part in out["policy_parts"])
    assert out["unplanned"] == ["RL rollout server at http://h:1: runs on GPUs this config does not place"]
    # the pre-flight: its checks
    assert ["toy server", False, "install toy"] in out["preflight"]
    assert not any(name in ("rollout server", "sglang") for name, _, _ in out["preflight"])
    # the rehearsal: a launched server holds a card; one behind a url does not
    assert out["roles"] == ["RL rollout server"] and out["roles_at_url"] == []
    # the cache identity: every field classified; the shipped configs keep their keys; where the
    # server runs is no part of the RL run's key, its other settings are
    assert out["classification"] == []
    for name, keys in out["keys"].items():
        assert keys == _keys(load_config(REPO / f"conf/pipeline/{name}.yaml")), name
    toy, elsewhere, other_pool = out["toy_keys"]
    assert toy[1] == elsewhere[1] and toy[0] != elsewhere[0]
    assert other_pool[0] != toy[0] and other_pool[2] != toy[2]
