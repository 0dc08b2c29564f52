"""Hardware specs: every number sourced, what-if overrides, YAML what-if files, presets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rdurack.errors import InvalidRequest
from rdurack.rack.presets import builtin_platforms, platform
from rdurack.rack.spec import LinkSpec, PlatformSpec, Sourced, TierSpec
from rdurack.rack.whatif import load_platform

PLATFORM_NAMES = sorted(builtin_platforms())


def _walk(model: BaseModel, path: str) -> Iterator[tuple[str, BaseModel]]:
    """Every model of the tree under `model`, with its dotted path."""
    yield path, model
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _walk(value, f"{path}.{name}")


def _numeric_fields(model: BaseModel) -> list[str]:
    return [
        name
        for name in type(model).model_fields
        if isinstance(getattr(model, name), int | float)
        and not isinstance(getattr(model, name), bool)
    ]


# ------------------------------------------------------------------ built-in platforms


def test_the_four_published_platforms_are_built_in() -> None:
    assert set(PLATFORM_NAMES) >= {"sn40l-node", "sn40l-rack16", "dgx-a100", "dgx-h100"}
    for name, spec in builtin_platforms().items():
        assert spec.name == name


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_builtin_platform_validates_again_from_its_dump(name: str) -> None:
    spec = builtin_platforms()[name]
    again = PlatformSpec.model_validate(spec.model_dump())
    assert again == spec


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_every_number_of_a_builtin_platform_names_its_source(name: str) -> None:
    spec = builtin_platforms()[name]
    checked = 0
    sourced_models = 0
    for path, model in _walk(spec, name):
        numbers = _numeric_fields(model)
        if not numbers:
            continue
        # A model holding numbers must be able to say where they come from.
        assert isinstance(model, Sourced), f"{path} holds numbers {numbers} but is not Sourced"
        sourced_models += 1
        for field in numbers:
            source = model.sources.get(field)
            assert isinstance(source, str), f"{path}.{field} has no source"
            assert source.strip(), f"{path}.{field} has an empty source"
            checked += 1
        assert set(model.sources) <= set(numbers), f"{path} sources unknown fields"
    # platform, node, socket, 3 tiers, kernels, 2 links
    assert sourced_models == 9
    assert checked >= 19  # launch_ho_ns is None on GPUs


# ------------------------------------------------------------------ the Sourced rule


def test_a_number_without_a_source_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as e:
        LinkSpec(
            bandwidth_bytes_per_s=64e9,
            latency_ns=1_000.0,
            sources={"bandwidth_bytes_per_s": "assumption: test"},
        )
    (err,) = e.value.errors()
    assert "no source for latency_ns;" in err["msg"]
    assert "bandwidth_bytes_per_s" not in err["msg"]


def test_an_empty_source_counts_as_none() -> None:
    with pytest.raises(ValidationError, match="latency_ns"):
        LinkSpec(
            bandwidth_bytes_per_s=64e9,
            latency_ns=1_000.0,
            sources={"bandwidth_bytes_per_s": "assumption: test", "latency_ns": ""},
        )


def test_no_sources_at_all_names_every_number() -> None:
    with pytest.raises(ValidationError) as e:
        TierSpec(capacity_bytes=1, bandwidth_bytes_per_s=1.0)
    assert "capacity_bytes" in str(e.value)
    assert "bandwidth_bytes_per_s" in str(e.value)


def test_a_source_for_an_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="bogus_ns"):
        LinkSpec(
            bandwidth_bytes_per_s=64e9,
            latency_ns=1_000.0,
            sources={"bandwidth_bytes_per_s": "a", "latency_ns": "b", "bogus_ns": "c"},
        )


def test_a_fully_sourced_link_is_accepted() -> None:
    link = LinkSpec(
        bandwidth_bytes_per_s=64e9,
        latency_ns=1_000.0,
        sources={"bandwidth_bytes_per_s": "a", "latency_ns": "b"},
    )
    assert link.bandwidth_bytes_per_s == 64e9
    assert link.latency_ns == 1_000.0


# ------------------------------------------------------------------ PlatformSpec.overridden

HBM_BW_OVERRIDE: dict[str, Any] = {"node": {"socket": {"hbm": {"bandwidth_bytes_per_s": 3.6e12}}}}


def test_overridden_replaces_one_nested_number_and_its_source_only() -> None:
    base = platform("sn40l-rack16")
    new = base.overridden(HBM_BW_OVERRIDE, "twice.yaml")

    assert new.socket.hbm.bandwidth_bytes_per_s == 3.6e12
    assert new.socket.hbm.sources["bandwidth_bytes_per_s"] == "what-if override (twice.yaml)"
    # The other number of the same tier keeps its value and its source.
    assert new.socket.hbm.capacity_bytes == base.socket.hbm.capacity_bytes
    assert new.socket.hbm.sources["capacity_bytes"] == base.socket.hbm.sources["capacity_bytes"]
    # Everything else is untouched.
    assert new.name == base.name
    assert new.nodes == base.nodes
    assert new.sources == base.sources
    assert new.node.sources == base.node.sources
    assert new.socket.sources == base.socket.sources
    assert new.socket.sram == base.socket.sram
    assert new.socket.ddr == base.socket.ddr
    assert new.socket.kernels == base.socket.kernels
    assert new.node.intra_node_link == base.node.intra_node_link
    assert new.inter_node_link == base.inter_node_link


def test_overridden_merges_overrides_at_several_levels() -> None:
    base = platform("sn40l-node")
    new = base.overridden(
        {
            "nodes": 3,
            "description": "three nodes",
            "node": {
                "intra_node_link": {"latency_ns": 2_000.0},
                "socket": {"ddr": {"capacity_bytes": 750_000_000_000}},
            },
        },
        "o",
    )
    assert new.nodes == 3
    assert new.sockets == 24
    assert new.sources["nodes"] == "what-if override (o)"
    # A string is not a hardware number: no source is written for it.
    assert new.description == "three nodes"
    assert "description" not in new.sources
    assert new.node.intra_node_link.latency_ns == 2_000.0
    assert new.node.intra_node_link.sources["latency_ns"] == "what-if override (o)"
    link = base.node.intra_node_link
    assert new.node.intra_node_link.bandwidth_bytes_per_s == link.bandwidth_bytes_per_s
    assert (
        new.node.intra_node_link.sources["bandwidth_bytes_per_s"]
        == link.sources["bandwidth_bytes_per_s"]
    )
    assert new.socket.ddr.capacity_bytes == 750_000_000_000
    assert new.socket.ddr.sources["capacity_bytes"] == "what-if override (o)"
    assert (
        new.socket.ddr.sources["bandwidth_bytes_per_s"]
        == (base.socket.ddr.sources["bandwidth_bytes_per_s"])
    )
    assert new.socket.hbm == base.socket.hbm


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        (
            {"node": {"socket": {"hbm": {"bogus_bytes": 1}}}},
            ("node", "socket", "hbm", "bogus_bytes"),
        ),
        ({"pods": 2}, ("pods",)),  # not "racks": that is a field now
    ],
    ids=["nested", "top-level"],
)
def test_overridden_refuses_unknown_fields(overrides: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as e:
        platform("sn40l-node").overridden(overrides, "o")
    assert any(err["loc"] == loc for err in e.value.errors())


@pytest.mark.parametrize(
    "overrides",
    [
        {"node": {"socket": {"hbm": {"bandwidth_bytes_per_s": -1.8e12}}}},
        {"node": {"socket": {"hbm": {"capacity_bytes": 0}}}},
        {"node": {"socket": {"kernels": {"memory_efficiency": 1.5}}}},
        {"nodes": 0},
        {"node": {"socket": {"hbm": {"bandwidth_bytes_per_s": "fast"}}}},
    ],
    ids=["negative-bandwidth", "zero-capacity", "efficiency-above-1", "zero-nodes", "not-number"],
)
def test_overridden_refuses_invalid_values(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        platform("sn40l-node").overridden(overrides, "o")


def test_overridden_refuses_to_set_sources() -> None:
    with pytest.raises(ValueError, match="sources"):
        platform("sn40l-node").overridden({"sources": {"nodes": "trust me"}}, "o")


def test_overridden_leaves_the_original_unchanged_and_presets_are_frozen() -> None:
    base = platform("sn40l-rack16")
    before = base.model_dump()
    base.overridden(HBM_BW_OVERRIDE, "o")
    assert base.model_dump() == before
    assert base.socket.hbm.bandwidth_bytes_per_s == 1.8e12
    assert base.socket.hbm.sources["bandwidth_bytes_per_s"].startswith("PAPER")
    # A fresh preset is unchanged too.
    assert platform("sn40l-rack16").model_dump() == before
    with pytest.raises(ValidationError):
        base.nodes = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        base.socket.hbm.bandwidth_bytes_per_s = 3.6e12  # type: ignore[misc]
    assert base.nodes == 2


# ------------------------------------------------------------------ what-if YAML files


def _write(tmp_path: Path, text: str, name: str = "whatif.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_platform_without_a_file_is_the_preset() -> None:
    assert load_platform("dgx-h100") == platform("dgx-h100")


def test_load_platform_applies_a_yaml_override_on_its_base(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "base: sn40l-rack16\nnode:\n  socket:\n    hbm: {bandwidth_bytes_per_s: 3.6e12}\n",
    )
    spec = load_platform("sn40l-node", f)
    assert spec.name == "sn40l-rack16"
    assert spec.nodes == 2
    # YAML 1.1 reads 3.6e12 as a string; the loader takes it as a number.
    assert isinstance(spec.socket.hbm.bandwidth_bytes_per_s, float)
    assert spec.socket.hbm.bandwidth_bytes_per_s == 3.6e12
    assert spec.socket.hbm.sources["bandwidth_bytes_per_s"] == f"what-if override ({f})"
    assert spec.socket.hbm.capacity_bytes == platform("sn40l-rack16").socket.hbm.capacity_bytes


def test_load_platform_takes_exponent_integers_as_integers(tmp_path: Path) -> None:
    f = _write(tmp_path, "node:\n  socket:\n    ddr: {capacity_bytes: 750e9}\n")
    spec = load_platform("sn40l-node", f)
    assert spec.socket.ddr.capacity_bytes == 750_000_000_000
    assert isinstance(spec.socket.ddr.capacity_bytes, int)


def test_load_platform_without_base_uses_the_given_name(tmp_path: Path) -> None:
    f = _write(tmp_path, "node:\n  intra_node_link:\n    latency_ns: 123\n")
    spec = load_platform("dgx-h100", f)
    assert spec.name == "dgx-h100"
    assert spec.socket.name == "H100-SXM-80GB"
    assert spec.node.intra_node_link.latency_ns == 123
    assert spec.node.intra_node_link.sources["latency_ns"] == f"what-if override ({f})"


def test_load_platform_names_the_dotted_path_of_an_unknown_field(tmp_path: Path) -> None:
    f = _write(tmp_path, "node:\n  socket:\n    hbm: {bandwdith_bytes_per_s: 3.6e12}\n")
    with pytest.raises(InvalidRequest) as e:
        load_platform("sn40l-node", f)
    assert "node.socket.hbm.bandwdith_bytes_per_s" in str(e.value)
    assert str(f) in str(e.value)


def test_load_platform_names_the_dotted_path_of_an_invalid_value(tmp_path: Path) -> None:
    f = _write(tmp_path, "node:\n  socket:\n    hbm: {bandwidth_bytes_per_s: -1}\n")
    with pytest.raises(InvalidRequest, match=r"node\.socket\.hbm\.bandwidth_bytes_per_s"):
        load_platform("sn40l-node", f)


def test_load_platform_refuses_sources_in_the_file(tmp_path: Path) -> None:
    f = _write(tmp_path, "sources: {nodes: trust me}\n")
    with pytest.raises(InvalidRequest, match="sources"):
        load_platform("sn40l-node", f)


@pytest.mark.parametrize(
    "text",
    ["node: {socket: [\n", "a: b: c\n", "\tnode: 1\n"],
    ids=["unclosed-flow", "nested-colon", "tab-indent"],
)
def test_load_platform_refuses_invalid_yaml(tmp_path: Path, text: str) -> None:
    f = _write(tmp_path, text)
    with pytest.raises(InvalidRequest, match="not valid YAML"):
        load_platform("sn40l-node", f)


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_load_platform_refuses_a_top_level_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    f = _write(tmp_path, text)
    with pytest.raises(InvalidRequest, match="mapping"):
        load_platform("sn40l-node", f)


def test_load_platform_refuses_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InvalidRequest, match=r"nope\.yaml"):
        load_platform("sn40l-node", missing)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_load_platform_with_an_empty_file_is_the_unchanged_platform(
    tmp_path: Path, text: str
) -> None:
    f = _write(tmp_path, text)
    assert load_platform("sn40l-rack16", f) == platform("sn40l-rack16")


def test_load_platform_keeps_quoted_strings_as_strings(tmp_path: Path) -> None:
    f = _write(tmp_path, 'description: "2024"\n')
    assert load_platform("sn40l-node", f).description == "2024"


def test_a_null_override_removes_an_optional_number_and_its_source(tmp_path: Path) -> None:
    f = _write(tmp_path, "node: {socket: {kernels: {launch_ho_ns: null}}}\n")
    kernels = load_platform("sn40l-node", f).socket.kernels
    assert kernels.launch_ho_ns is None
    assert "launch_ho_ns" not in kernels.sources


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    f = _write(tmp_path, f"node: {{socket: {{hbm: {{bandwidth_bytes_per_s: {value}}}}}}}\n")
    with pytest.raises(InvalidRequest, match=r"node\.socket\.hbm\.bandwidth_bytes_per_s"):
        load_platform("sn40l-node", f)


# ------------------------------------------------------------------ published figures


def test_sn40l_socket_matches_paper_table_ii() -> None:
    s = platform("sn40l-node").socket
    assert s.kind == "rdu"
    assert s.peak_flops_per_s == 638e12
    assert s.hbm.capacity_bytes == 64_000_000_000
    assert s.hbm.bandwidth_bytes_per_s == 1.8e12
    assert s.ddr.capacity_bytes == 1_500_000_000_000
    assert s.ddr.bandwidth_bytes_per_s == 200e9
    assert s.sram.capacity_bytes == 520_000_000


def test_sn40l_node_has_8_sockets_and_the_rack_2_nodes() -> None:
    node = platform("sn40l-node")
    rack = platform("sn40l-rack16")
    assert node.nodes == 1
    assert node.node.sockets == 8
    assert node.sockets == 8
    assert rack.nodes == 2
    assert rack.node.sockets == 8
    assert rack.sockets == 16
    assert rack.socket == node.socket


@pytest.mark.parametrize(
    ("name", "peak", "hbm_bw", "host_link"),
    [("dgx-a100", 312e12, 2.0e12, 32e9), ("dgx-h100", 989e12, 3.35e12, 64e9)],
)
def test_dgx_gpus_match_their_datasheets(
    name: str, peak: float, hbm_bw: float, host_link: float
) -> None:
    p = platform(name)
    s = p.socket
    assert s.kind == "gpu"
    assert p.nodes == 1
    assert p.node.sockets == 8
    assert s.peak_flops_per_s == peak
    assert s.hbm.capacity_bytes == 80_000_000_000
    assert s.hbm.bandwidth_bytes_per_s == pytest.approx(hbm_bw)
    assert s.ddr.bandwidth_bytes_per_s == host_link
    assert s.ddr_to_hbm_bandwidth_bytes_per_s == host_link
    assert s.kernels.dataflow_fusion is False
    assert s.kernels.launch_ho_ns is None
