"""`paravt --help`: the commands in the order a user meets them, the miniature's under one group."""

from __future__ import annotations

import argparse
import re

from paravt_core.cli import build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_top_level_commands_run_from_the_pipeline_to_the_reports_then_the_miniature():
    commands = list(_commands(build_parser()))
    assert commands[:2] == ["run", "reproduce"] and commands[-1] == "miniature"
    assert commands.index("synth") < commands.index("eval") < commands.index("report")
    # the tiny model's probes are not top-level commands any more
    assert not {"reading-probe", "caption-probe", "agent-probe", "perception", "rollout-probe"} & set(commands)


def test_the_miniature_group_holds_its_probes_and_report():
    miniature = _commands(_commands(build_parser())["miniature"])
    assert set(miniature) == {"reading-probe", "caption-probe", "agent-probe", "perception", "rollout-probe", "report"}


def test_help_texts_are_written_for_users_not_issue_trackers():
    parser = build_parser()
    texts = [parser.format_help()]
    for sub in _commands(parser).values():
        texts.append(sub.format_help())
        try:
            texts += [p.format_help() for p in _commands(sub).values()]
        except ValueError:  # a command without subcommands
            pass
    assert not [t for t in texts if re.search(r"#\d+", t)]
