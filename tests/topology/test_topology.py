"""The topology model read from recorded `nvidia-smi topo -m` texts: links, NICs, affinity; env.json round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.contract.errors import ConfigError
from musubi.preflight.checks.comm import promised_busbw
from musubi.topology.model import NodeTopology, format_cpulist, link_cost, parse_cpulist
from musubi.topology.read import load_topology

from ..preflight.crafted import gpu
from .recorded import ALL, FIXTURES, NVLINK4, NVSWITCH8, PAIRS8, PCIE8, recorded


def test_pcie_two_switches_two_sockets() -> None:
    t = recorded(PCIE8)
    assert t.source == "nvidia-smi" and t.gpu_indices == list(range(8)) and len(t.links) == 28
    assert (t.link(0, 1), t.link(1, 0), t.link(0, 2), t.link(3, 4), t.link(6, 7)) == ("PIX", "PIX", "PXB", "SYS",
                                                                                      "PIX")
    assert t.numa_of(0) == 0 and t.numa_of(7) == 1
    assert t.gpu(5).cpus == parse_cpulist("16-31,48-63")  # type: ignore[union-attr]
    assert [n.name for n in t.nics] == ["mlx5_0", "mlx5_1"]
    assert t.nearest_nics(2) == ["mlx5_0"] and t.nearest_nics(6) == ["mlx5_1"]
    assert t.nvlink_domain() == 1
    assert "8 GPUs" in t.summary() and "NICs mlx5_0,mlx5_1" in t.summary()


def test_nvlink_shapes() -> None:
    pairs, switch, four = recorded(PAIRS8), recorded(NVSWITCH8), recorded(NVLINK4)
    assert pairs.link(2, 3) == "NV4" and pairs.link(1, 2) == "NODE" and pairs.link(0, 7) == "SYS"
    assert (pairs.nvlink_domain(), switch.nvlink_domain(), four.nvlink_domain()) == (2, 8, 4)
    assert switch.nearest_nics(5) == ["mlx5_2"] and four.nics == ()
    assert [four.numa_of(i) for i in range(4)] == [0, 0, 1, 1]
    # the preflight's bandwidth promise reads the same model
    assert promised_busbw([gpu(i) for i in range(4)], four)[1] == "NVLink (NV18)"  # type: ignore[index]


def test_link_costs_order_the_classes() -> None:
    words = ["NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]
    costs = [link_cost(w) for w in words]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    assert link_cost(None) == link_cost("SYS")


@pytest.mark.parametrize("name", ALL)
def test_env_json_round_trip_and_recorded_files(name: str, tmp_path: Path) -> None:
    t = recorded(name)
    back = NodeTopology.from_dict(json.loads(json.dumps(t.to_dict())))
    assert (back.links, back.gpus, back.nics) == (t.links, t.gpus, t.nics)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"host": "x", "topology": t.to_dict()}))
    assert load_topology(env).links == t.links and load_topology(FIXTURES / name).gpus == t.gpus
    assert load_topology(env).source == "recorded:env.json"


def test_older_env_json_and_bad_files(tmp_path: Path) -> None:
    assert NodeTopology.from_dict({"gpu0-gpu1": "NV18"}).link(1, 0) == "NV18"
    bad = tmp_path / "topo.txt"
    bad.write_text("No devices were found\n")
    with pytest.raises(ConfigError, match="no GPU found in it"):
        load_topology(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_topology(tmp_path / "missing.txt")


def test_cpulists() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11) and parse_cpulist("N/A") == ()
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


def test_planner_reads_the_same_model() -> None:
    from musubi.plan.catalog import get_gpu
    from musubi.plan.cluster import fit_to_topology, make_cluster

    h100 = get_gpu("H100-SXM")
    pairs = fit_to_topology(h100, recorded(PAIRS8))
    assert (pairs.nvlink_domain, pairs.gpus_per_node, pairs.nvlink_gbps) == (2, 8, 100.0)
    assert make_cluster(fit_to_topology(h100, recorded(NVSWITCH8)), 8).nvlink_domain == 8
    assert make_cluster(fit_to_topology(h100, recorded(PCIE8)), 8).nvlink_domain == 1


def test_live_reading_merges_nvidia_smi_with_nvml_and_falls_back_to_sysfs(monkeypatch, tmp_path: Path) -> None:
    from musubi.topology import read as reader
    from musubi.topology.nvml import NvmlReading

    gpus = tuple(gpu(i) for i in range(4))
    nvml_topo = NodeTopology(links={(0, 1): "NV18"}, p2p={(0, 1): "OK"}, source="nvml")
    monkeypatch.setattr(reader, "read_nvml", lambda with_xids=True: (NvmlReading(True, gpus), nvml_topo))
    monkeypatch.setattr(reader, "read_topo_text", lambda: (FIXTURES / NVLINK4).read_text())
    t = reader.read_node_topology()
    assert t.source == "nvidia-smi" and t.numa_of(3) == 1 and t.p2p_status(1, 0) == "OK"
    assert t.gpu(2).bus_id == gpus[2].pci_bus_id  # type: ignore[union-attr]
    # no nvidia-smi: NVML's links, NUMA node and local CPUs from sysfs
    monkeypatch.setattr(reader, "read_topo_text", lambda: None)
    bus = gpus[0].pci_bus_id
    dom, _, rest = bus.lower().partition(":")
    dev = tmp_path / f"{dom[-4:]}:{rest}"
    dev.mkdir()
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("8-15\n")
    monkeypatch.setattr(reader, "SYSFS_PCI", tmp_path)
    t = reader.read_node_topology()
    assert t.source == "nvml" and t.link(0, 1) == "NV18" and t.numa_of(0) == 1 and t.gpu(0).cpus == tuple(range(8, 16))
    assert t.numa_of(1) is None  # sysfs has nothing for it



def test_env_json_without_topology_and_non_pair_keys_are_config_errors(tmp_path: Path) -> None:
    cpu_env = tmp_path / "env.json"
    cpu_env.write_text(json.dumps({"host": "x", "gpus": []}))  # written on a machine without GPUs
    with pytest.raises(ConfigError, match="without a `topology`"):
        load_topology(cpu_env)
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"topology": {"links": {"host": "NV18"}}}))
    with pytest.raises(ConfigError, match="not a GPU pair"):
        load_topology(odd)
    with pytest.raises(ValueError, match="not a GPU pair"):
        NodeTopology.from_dict({"links": {"gpu0": "NV4"}})


@pytest.mark.parametrize("name", ALL)
def test_preflight_json_keeps_the_topology_in_env_json_form(name: str) -> None:
    from musubi.preflight.result import jsonable

    t = recorded(name)
    rec = json.loads(json.dumps(jsonable({"topology": t})))["topology"]
    back = NodeTopology.from_dict(rec)  # before: keys "0-1" and cpus as a list -> ValueError
    assert back.links == t.links and back.gpus == t.gpus and back.nics == t.nics


def test_env_topology_reads_what_env_json_recorded(tmp_path: Path) -> None:
    from musubi.topology.read import env_topology

    t = recorded(PCIE8)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"host": "x", "topology": t.to_dict()}))
    assert env_topology(env).links == t.links and env_topology(env).gpus == t.gpus
    env.write_text(json.dumps({"host": "x"}))
    assert env_topology(env) is None and env_topology(tmp_path / "missing.json") is None
