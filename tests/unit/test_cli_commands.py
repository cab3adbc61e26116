"""`paravt --help`: the commands in the order a user meets them, the miniature's under one group."""

from __future__ import annotations

import argparse
import errno
import os
import re

import pytest

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
    assert set(miniature) == {"reading-probe", "caption-probe", "agent-probe", "perception", "rollout-probe", "opening-probe", "sampled-probe", "branch-probe", "branch-push",
                              "advantage-split", "visibility", "report"}


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


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`paravt ... | head`: the reader leaves while the command still writes; no traceback, exit 0."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "writes_a_lot.py"
    script.write_text(
        "import argparse, sys\n"
        "import paravt_core.cli as cli\n"
        "def write(args):\n"
        "    for _ in range(200000):\n"
        "        print('x' * 80)\n"
        "    return 0\n"
        "class Parser:\n"
        "    def parse_args(self, argv):\n"
        "        return argparse.Namespace(func=write)\n"
        "cli.build_parser = Parser\n"
        "sys.exit(cli.main([]))\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(f"set -o pipefail; {sys.executable} {script} | head -1", shell=True, cwd=repo,
                          capture_output=True, text=True, executable="/bin/bash",
                          env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert done.stdout == "x" * 80 + "\n"
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_report_names_the_experiments_there_are_when_asked_for_another(tmp_path, capsys):
    import mlflow

    from paravt_core.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.create_experiment("paravt-tiny")
    assert main(["report", "--experiment", "paravt", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no MLflow experiment 'paravt'" in err and "paravt-tiny" in err
    assert main(["miniature", "report", "--experiment", "paravt", "--tracking-uri", uri]) == 2
    assert "paravt-tiny" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["report", "--experiment", "x"], ["synth"], ["tiny-model"]])
def test_an_out_folder_under_a_file_is_a_usage_error(tmp_path, capsys, argv):
    """Issue #48 item 9: these ended in a NotADirectoryError / FileExistsError traceback at the first write."""
    from paravt_core.cli import main

    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "out"
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--out", str(out)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --out: {out}: {tmp_path / 'a_file'} is a file, not a folder" in err
    assert "Traceback" not in err


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


@pytest.mark.parametrize("code, status, says", [
    (errno.ENOSPC, 1, "no space left writing {file} (No space left on device); free space on that disk"),
    (errno.EDQUOT, 1, "no space left writing {file}"),
    (errno.EROFS, 2, "cannot write {file} (Read-only file system): the file system is read-only"),
    (errno.EACCES, 2, "cannot access {file} (Permission denied): give this user access to it"),
], ids=["ENOSPC", "EDQUOT", "EROFS", "EACCES"])
def test_a_full_disk_or_read_only_output_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch, code, status,
                                                                      says):
    """#61 partial: a full disk in `tiny-model` or the data stage, or a read-only output folder, was a traceback."""
    from paravt_core.cli import main

    file = tmp_path / "out" / "model.safetensors"
    monkeypatch.setattr("paravt_core.model.tiny.build_tiny_model", _raise(OSError(code, os.strerror(code), str(file))))
    assert main(["tiny-model", "--out", str(tmp_path / "out")]) == status
    err = capsys.readouterr().err
    assert err.startswith("paravt tiny-model: ") and says.format(file=file) in err and err.count("\n") == 1
    # Raised deep in a stage and wrapped on the way up (a task, a worker pool): the cause is found.
    try:
        raise OSError(code, os.strerror(code), str(file))
    except OSError as cause:
        wrapped = RuntimeError("the data stage failed")
        wrapped.__cause__ = cause
    monkeypatch.setattr("paravt_core.data.cli.generate_world", _raise(wrapped))
    assert main(["synth", "--out", str(tmp_path / "world")]) == status
    assert says.format(file=file) in capsys.readouterr().err


def test_other_os_errors_are_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    from paravt_core.cli import main

    monkeypatch.setattr("paravt_core.model.tiny.build_tiny_model", _raise(OSError(errno.EIO, "I/O error", "x")))
    with pytest.raises(OSError, match="I/O error"):
        main(["tiny-model", "--out", str(tmp_path / "out")])
