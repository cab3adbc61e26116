"""Single-node workers rendezvous without a network listener (`paravt_core.dist`): a
FileStore and loopback-bound gloo sockets; multi-node keeps env:// TCP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paravt_core.dist.launch import RENDEZVOUS_FILE_ENV, free_port, rendezvous_env

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1"}


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = socket.inet_ntop(socket.AF_INET6, words)
    return address.removeprefix("::ffff:")


def listening_addresses(pid: int) -> set[str]:
    """Local addresses of the TCP sockets a process listens on (state 0A in /proc/net/tcp*)."""
    inodes, found = _socket_inodes(pid), set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.add(_address(fields[1].split(":")[0]))
    return found


WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from paravt_core.dist.rank import init_distributed
    if sys.argv[1] == "ours":
        rank, world, device = init_distributed()
    else:  # torch's default env:// rendezvous, for contrast
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.ones(1)
    dist.all_reduce(total)
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # PrefixStore wraps the rendezvous store
        store = store.underlying_store
    store = type(store).__name__
    print(f"ready {rank} {world} {int(total.item())} {store}", flush=True)
    sys.stdin.readline()
    dist.destroy_process_group()
""")


def _ready_line(rank: subprocess.Popen) -> str:
    """The worker's "ready ..." line, past DeepSpeed's own log lines on stdout."""
    for line in rank.stdout:
        if line.startswith("ready "):
            return line.strip()
    return ""


def run_two_ranks(mode: str, tmp_path: Path) -> tuple[list[str], set[str]]:
    port = free_port()
    base = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    base.pop(RENDEZVOUS_FILE_ENV, None)
    if mode == "ours":
        base.update(rendezvous_env(tmp_path))
    ranks = [subprocess.Popen([sys.executable, "-c", WORKER, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    try:
        lines = [_ready_line(rank) for rank in ranks]
        addresses = set().union(*(listening_addresses(rank.pid) for rank in ranks))
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.stdin.write("\n")
                rank.stdin.flush()
        for rank in ranks:
            rank.wait(timeout=60)
    return lines, addresses


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc to read listening sockets")
def test_single_node_workers_listen_on_loopback_only_and_use_a_file_store(tmp_path):
    lines, addresses = run_two_ranks("ours", tmp_path)
    assert lines == ["ready 0 2 2 FileStore", "ready 1 2 2 FileStore"]
    assert addresses <= LOOPBACK, addresses
    # the same check on torch's default rendezvous does see the store on every interface
    lines, addresses = run_two_ranks("default", tmp_path)
    assert [line.split()[-1] for line in lines] == ["TCPStore", "TCPStore"]
    assert addresses - LOOPBACK, addresses


def test_multi_node_keeps_tcp_and_single_node_gets_a_private_file_store(tmp_path):
    assert rendezvous_env(None) == {}
    env = rendezvous_env(tmp_path)
    assert env[RENDEZVOUS_FILE_ENV] == str(tmp_path / "store")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
