"""The sharded node's pieces that need no database: its ``/metrics`` page merged from the
shards' pages (daemon.shards.metricspage), the request routing of the default door, and a
shard's own config (daemon.shards.runtime)."""

from __future__ import annotations

from pathlib import Path

from daemon.api.peer import Peer
from daemon.api.server import Request
from daemon.config import load_config
from daemon.shards.metricspage import merge, with_label
from daemon.shards.runtime import _operation_of, shard_config

PAGE = """\
# HELP bide_build_info The bide version; always 1.
# TYPE bide_build_info gauge
bide_build_info{{version="1"}} 1
# HELP process_cpu_seconds_total CPU.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 2.5
# HELP bide_requests_sent_total Requests sent.
# TYPE bide_requests_sent_total counter
bide_requests_sent_total {n}
# HELP bide_poll_seconds Poll latency.
# TYPE bide_poll_seconds histogram
bide_poll_seconds_bucket{{provider="sim",le="0.1"}} {n}
bide_poll_seconds_sum{{provider="sim"}} 0.5
bide_poll_seconds_count{{provider="sim"}} {n}
# HELP bide_node_active 1 while active.
# TYPE bide_node_active gauge
bide_node_active 1
"""


def test_a_label_goes_first_among_a_samples_labels() -> None:
    assert with_label("up 1", 'shard="3"') == 'up{shard="3"} 1'
    assert with_label('x{a="b"} 2', 'shard="0"') == 'x{shard="0",a="b"} 2'
    assert with_label("x{} 2", 'shard="0"') == 'x{shard="0"} 2'


def test_the_node_page_has_each_family_once_with_every_shards_samples() -> None:
    page = merge(
        {3: PAGE.format(n=7), 1: PAGE.format(n=4)},
        ["# TYPE bide_node_active gauge", "bide_node_active 1"],
    )
    lines = page.splitlines()
    assert lines[:2] == ["# TYPE bide_node_active gauge", "bide_node_active 1"]
    # What describes the process comes once, from the node; never a shard's copy.
    assert page.count("bide_node_active") == 2
    assert "bide_build_info" not in page
    assert "process_cpu_seconds_total" not in page
    # Each family's HELP and TYPE once, then its samples from every shard, in shard order.
    at = lines.index("# TYPE bide_requests_sent_total counter")
    assert lines[at - 1] == "# HELP bide_requests_sent_total Requests sent."
    assert lines[at + 1 : at + 3] == [
        'bide_requests_sent_total{shard="1"} 4',
        'bide_requests_sent_total{shard="3"} 7',
    ]
    at = lines.index("# TYPE bide_poll_seconds histogram")
    assert lines[at + 1 : at + 7] == [
        'bide_poll_seconds_bucket{shard="1",provider="sim",le="0.1"} 4',
        'bide_poll_seconds_sum{shard="1",provider="sim"} 0.5',
        'bide_poll_seconds_count{shard="1",provider="sim"} 4',
        'bide_poll_seconds_bucket{shard="3",provider="sim",le="0.1"} 7',
        'bide_poll_seconds_sum{shard="3",provider="sim"} 0.5',
        'bide_poll_seconds_count{shard="3",provider="sim"} 7',
    ]
    types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(types) == len(set(types))


def _request(method: str, path: str, body: bytes = b"") -> Request:
    return Request(method, path, path, {}, {}, body, Peer(1, 0, 0))


def test_the_default_door_finds_the_operation_a_request_names() -> None:
    assert _operation_of(_request("GET", "/v1/operations/op-7")) == "op-7"
    assert _operation_of(_request("GET", "/v1/operations/op-7/story")) == "op-7"
    assert _operation_of(_request("POST", "/v1/operations/op-7/decisions")) == "op-7"
    body = b'{"operation_id": "op-9", "provider": "sim", "job_id": "j"}'
    assert _operation_of(_request("POST", "/v1/operations", body)) == "op-9"
    assert _operation_of(_request("POST", "/v1/operations", b'{"provider": "sim"}')) is None
    assert _operation_of(_request("POST", "/v1/operations", b"not json")) is None
    assert _operation_of(_request("GET", "/v1/operations")) is None
    assert _operation_of(_request("GET", "/v1/escalations")) is None


def test_a_shard_keeps_its_state_under_the_nodes(tmp_path: Path) -> None:
    (tmp_path / "bide.toml").write_text('[paths]\nstate_dir = "state"\n')
    cfg = load_config(str(tmp_path / "bide.toml"))
    scfg = shard_config(cfg, 7)
    assert scfg.state_dir == cfg.state_dir / "shards" / "007"
    assert scfg.log_dir == cfg.state_dir / "shards" / "007" / "log"
    assert scfg.snapshot_path.parent == scfg.state_dir
    assert cfg.state_dir == (tmp_path / "state").resolve()  # the node's own is untouched
    assert scfg.profiles_dir == cfg.profiles_dir
    assert scfg.spool_dir == cfg.spool_dir  # one spool per node, each file to its shard
