"""DeepSpeed's CPU allreduce segments in /dev/shm are released after every run
(`paravt_core.dist.launch.release_shm_buffers`): DeepSpeed itself never unlinks them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paravt_core.dist.launch import SHM_BUFFER_PREFIX, SHM_DIR, free_port, launch_workers, release_shm_buffers


def _segment(addr: str, port: int | str, rank: int, uid: int | None = None) -> str:
    return f"{SHM_BUFFER_PREFIX}_{os.getuid() if uid is None else uid}_{addr}_{port}_{rank}"


def test_release_removes_one_launch_and_leaves_the_others(tmp_path):
    names = [_segment("127.0.0.1", 29500, 0), _segment("127.0.0.1", 29500, 1), _segment("127.0.0.1", 29501, 0),
             _segment("127.0.0.1", 129500, 0), _segment("127.0.0.1", 29500, 0, uid=os.getuid() + 1), "other_file"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = release_shm_buffers(29500, shm_dir=tmp_path)
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    # one rank's only; an in-process run without MASTER_* names the segment with empty fields
    (tmp_path / _segment("", "", 0)).write_bytes(b"x")
    assert [p.name for p in release_shm_buffers("", addr="", rank=0, shm_dir=tmp_path)] == [_segment("", "", 0)]
    assert release_shm_buffers(29501, addr="127.0.0.1", rank=1, shm_dir=tmp_path) == []


WORKER = textwrap.dedent("""
    import os
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from paravt_core.dist.launch import SHM_BUFFER_PREFIX, SHM_DIR
    from paravt_core.dist.rank import init_distributed
    rank, world, _ = init_distributed()
    total = torch.ones(1)
    dist.all_reduce(total)
    own = SHM_DIR / f"{SHM_BUFFER_PREFIX}_{os.getuid()}_{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}_{rank}"
    print(f"rank {rank} sum {int(total.item())} segment {own.exists()}", flush=True)
    (Path(os.environ["SEGMENT_NAMES"]) / f"rank{rank}").write_text(own.name)
    dist.barrier()
    os._exit(0)  # as a crash would: no process-group teardown, no cleanup of our own
""")


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{SHM_BUFFER_PREFIX}_{os.getuid()}_*")}


@pytest.mark.integration
@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs a /dev/shm")
def test_launched_workers_leave_no_allreduce_segment_behind(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    lines: list[str] = []
    names_dir = tmp_path / "segments"
    names_dir.mkdir()
    launch_workers(script, [], num_ranks=2, log_line=lines.append,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "SEGMENT_NAMES": str(names_dir)})
    # the two ranks share one pipe: their lines may interleave
    reports = sorted(re.findall(r"rank \d sum \d segment (?:True|False)", "\n".join(lines)))
    # the segments did exist while the ranks ran (so the check below can fail) ...
    assert reports == ["rank 0 sum 2 segment True", "rank 1 sum 2 segment True"], lines[-20:]
    # ... and neither is left once the launch returns (only this launch's: tests running beside
    # this one may hold segments of their own)
    names = {f.read_text() for f in names_dir.iterdir()}
    assert len(names) == 2 and names & _segments() == set()


IN_PROCESS = textwrap.dedent("""
    import os
    from paravt_core.dist.launch import SHM_BUFFER_PREFIX, SHM_DIR
    from paravt_core.dist.rank import init_distributed, shutdown_distributed
    init_distributed()
    own = SHM_DIR / f"{SHM_BUFFER_PREFIX}_{os.getuid()}_{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}_0"
    made = own.exists()
    shutdown_distributed()
    print(f"made {made} left {own.exists()}")
""")


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs a /dev/shm")
def test_shutdown_in_process_releases_this_ranks_segment():
    # a fresh process: DeepSpeed maps its segment once per process, at the first init, and
    # only when LOCAL_SIZE (set by its launcher) says every rank is on this host
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1"}
    env.pop("PARAVT_RENDEZVOUS_FILE", None)
    out = subprocess.run([sys.executable, "-c", IN_PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "made True left False" in out.stdout, out.stdout[-2000:]
