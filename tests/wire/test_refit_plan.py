"""Refit plans: the gates, the digest, the schedule and decoding hostile input (wire.refit)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.wire.refit import (
    MAX_DIM,
    MAX_PLAN_BYTES,
    SPLIT_MIN_BYTES,
    Layout,
    MeshSpec,
    ParamPlan,
    PlanError,
    ReshardPlan,
    assign_lanes,
    decode_bootstrap,
    decode_plan,
    digest,
    encode_plan,
    make_plan,
    megatron_layout,
    megatron_params,
    replicate,
    schedule,
    shard,
)

TRAINER = MeshSpec(name="trainer", size=2, tp=2)
GENERATOR = MeshSpec(name="generator", size=4, tp=4)
TENSORS = {
    "embed": ("float32", (16, 8)),
    "l0.qkv": ("bfloat16", (24, 8)),
    "l0.proj": ("bfloat16", (8, 8)),
    "l0.proj.bias": ("bfloat16", (8,)),
    "norm": ("float32", (8,)),
}
ROLES = {
    "embed": "column",
    "l0.qkv": "column",
    "l0.proj": "row",
    "l0.proj.bias": "replicated",
    "norm": "replicated",
}


def base_plan(misc: tuple[str, ...] = ("norm",)) -> ReshardPlan:
    return make_plan(
        megatron_layout(TRAINER, TENSORS, ROLES), megatron_layout(GENERATOR, TENSORS, ROLES), misc
    )


def param(**kw: Any) -> ParamPlan:
    fields = {"name": "w", "dtype": "float32", "shape": (8, 4), "placement": shard(0)}
    fields.update(kw)
    return ParamPlan(**fields)


def plan_of(pub: list[ParamPlan], sub: list[ParamPlan], **kw: Any) -> ReshardPlan:
    names = sorted({p.name for p in pub})
    return ReshardPlan(
        publisher=Layout(mesh=kw.get("pub_mesh", TRAINER), params=tuple(pub)),
        subscriber=Layout(mesh=kw.get("sub_mesh", GENERATOR), params=tuple(sub)),
        bulk=kw.get("bulk", tuple(names)),
        misc=kw.get("misc", ()),
    )


# -- the digest -------------------------------------------------------------------------------


def test_the_digest_is_a_sha256_hex_that_round_trips_the_wire() -> None:
    plan = base_plan()
    d = digest(plan)
    assert len(d) == 64 and int(d, 16) >= 0
    assert digest(decode_plan(encode_plan(plan))) == d
    assert digest(decode_plan(msgspec.to_builtins(plan))) == d


def test_the_digest_ignores_the_order_of_the_bulk_set_and_of_each_sides_parameters() -> None:
    plan = base_plan()
    shuffled = ReshardPlan(
        publisher=Layout(mesh=TRAINER, params=plan.publisher.params[::-1]),
        subscriber=Layout(
            mesh=GENERATOR, params=plan.subscriber.params[1:] + plan.subscriber.params[:1]
        ),
        bulk=plan.bulk[::-1],
        misc=plan.misc,
    )
    assert digest(shuffled) == digest(plan)


def test_the_digest_follows_the_order_of_the_misc_list() -> None:
    a = base_plan(misc=("norm", "l0.proj.bias"))
    b = base_plan(misc=("l0.proj.bias", "norm"))
    assert digest(a) != digest(b)


def test_an_empty_group_key_is_the_parameter_itself() -> None:
    a = plan_of([param()], [param(partition_count=4)])
    b = plan_of([param(group_key="w")], [param(partition_count=4, group_key="w")])
    assert digest(a) == digest(b)


#: One change per field that changes the transfer (and whether it must be made on both sides
#: for the plan to stay valid); each must change the digest.
FIELD_CHANGES = {
    "dtype": ({"dtype": "bfloat16"}, True),
    "shape": ({"shape": (16, 4)}, True),
    "name": ({"name": "v"}, True),
    "partition": ({"placement": shard(1)}, False),
    "group key": ({"group_key": "layer0"}, False),
    "placements": ({"placement": replicate(), "partition_count": 1}, False),
    "rank offset": ({"partition_count": 1, "rank_offset": 1}, False),
    "partition count": ({"partition_count": 1}, False),
}


@pytest.mark.parametrize("field", FIELD_CHANGES, ids=list(FIELD_CHANGES))
def test_every_field_that_changes_the_transfer_changes_the_digest(field: str) -> None:
    pub, sub = {"partition_count": 2}, {"partition_count": 4}
    before = digest(plan_of([param(**pub)], [param(**sub)]))
    change, both = FIELD_CHANGES[field]
    if both:
        after = plan_of([param(**{**pub, **change})], [param(**{**sub, **change})])
        assert digest(after) != before
        return
    on_publisher = plan_of([param(**{**pub, **change})], [param(**sub)])
    on_subscriber = plan_of([param(**pub)], [param(**{**sub, **change})])
    assert len({before, digest(on_publisher), digest(on_subscriber)}) == 3


def test_the_meshes_are_in_the_digest() -> None:
    plan = plan_of([param(partition_count=2)], [param(partition_count=4)])
    wider = plan_of(
        [param(partition_count=2)],
        [param(partition_count=4)],
        sub_mesh=MeshSpec(name="generator", size=8, tp=4),
    )
    renamed = plan_of(
        [param(partition_count=2)],
        [param(partition_count=4)],
        sub_mesh=MeshSpec(name="other", size=4, tp=4),
    )
    assert len({digest(plan), digest(wider), digest(renamed)}) == 3


def test_moving_a_parameter_between_bulk_and_misc_changes_the_digest() -> None:
    assert digest(base_plan(misc=())) != digest(base_plan(misc=("norm",)))


# -- the gates ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: MeshSpec(name="m", size=0), "size must be in 1.."),
        (lambda: MeshSpec(name="m", size=-2), "size must be in 1.."),
        (lambda: MeshSpec(name="m", size=4, tp=0), "tp must be in 1.."),
        (lambda: MeshSpec(name="m", size=6, tp=4), "tp=4 does not divide its size 6"),
        (lambda: MeshSpec(name="", size=1), "mesh name must not be empty"),
        (lambda: MeshSpec(name="m", size=True), "size must be an integer"),
        (lambda: param(shape=(8, 0)), "w: shape[1] must be in 1.."),
        (lambda: param(shape=(-8, 4)), "w: shape[0] must be in 1.."),
        (lambda: param(shape=(MAX_DIM + 1,)), "w: shape[0] must be in 1.."),
        (lambda: param(shape=(2**30, 2**30)), "is over"),
        (lambda: param(shape=(1,) * 17, placement=replicate()), "17 dimensions"),
        (lambda: param(dtype="float128"), "unknown dtype 'float128'"),
        (lambda: param(partition_count=3), "partition_count 3 does not divide shape[0] = 8"),
        (lambda: param(partition_count=0), "partition_count must be in 1.."),
        (lambda: param(rank_offset=-1), "rank_offset must be in 0.."),
        (lambda: param(placement=shard(2)), "shard dim 2 is outside its shape [8, 4]"),
        (lambda: param(placement=replicate(), partition_count=2), "a replicated parameter"),
        (lambda: param(name="w\n"), "unprintable"),
        (lambda: param(name=""), "parameter name must not be empty"),
        (
            lambda: Layout(mesh=TRAINER, params=(param(rank_offset=1, partition_count=2),)),
            "partitions 1..2 lie outside the tensor-parallel ranks 0..1 of mesh 'trainer'",
        ),
        (lambda: Layout(mesh=TRAINER, params=(param(), param())), "declares 'w' more than once"),
    ],
)
def test_a_malformed_layout_is_refused_with_what_is_wrong(build: Any, message: str) -> None:
    with pytest.raises(PlanError, match=None) as e:
        build()
    assert message in str(e.value)


def test_coverage_names_the_missing_parameters() -> None:
    plan = base_plan()
    with pytest.raises(PlanError) as e:
        ReshardPlan(publisher=plan.publisher, subscriber=plan.subscriber, bulk=("embed",))
    msg = str(e.value)
    assert "missing from bulk and misc: 'l0.proj', 'l0.proj.bias', 'l0.qkv', 'norm'" in msg


def test_coverage_names_a_parameter_listed_twice() -> None:
    plan = base_plan()
    with pytest.raises(PlanError, match=r"named more than once: 'norm'"):
        ReshardPlan(
            publisher=plan.publisher,
            subscriber=plan.subscriber,
            bulk=(*plan.bulk, "norm"),
            misc=("norm",),
        )
    with pytest.raises(PlanError, match=r"named more than once: 'embed'"):
        ReshardPlan(
            publisher=plan.publisher,
            subscriber=plan.subscriber,
            bulk=(*plan.bulk, "embed"),
            misc=plan.misc,
        )


def test_coverage_names_an_undeclared_parameter() -> None:
    plan = base_plan()
    with pytest.raises(PlanError, match=r"named but not declared: 'ghost'"):
        ReshardPlan(
            publisher=plan.publisher,
            subscriber=plan.subscriber,
            bulk=(*plan.bulk, "ghost"),
            misc=plan.misc,
        )


def test_coverage_holds_for_a_plan_that_names_everything_once() -> None:
    plan = base_plan()
    assert sorted((*plan.bulk, *plan.misc)) == sorted(TENSORS)


def test_sides_that_declare_different_parameters_are_refused_with_the_names() -> None:
    with pytest.raises(PlanError, match=r"only the subscriber declares 'v'"):
        plan_of([param()], [param(partition_count=4), param(name="v")], bulk=("w",))


@pytest.mark.parametrize(
    ("sub", "message"),
    [
        (
            {"dtype": "float16"},
            "w: the publisher declares float32[8, 4], the subscriber float16[8, 4]",
        ),
        (
            {"shape": (8, 8)},
            "w: the publisher declares float32[8, 4], the subscriber float32[8, 8]",
        ),
    ],
)
def test_sides_that_disagree_on_a_tensor_are_refused(sub: dict, message: str) -> None:
    with pytest.raises(PlanError) as e:
        plan_of([param()], [param(**sub)])
    assert message in str(e.value)


def test_a_sharded_misc_parameter_is_refused() -> None:
    with pytest.raises(PlanError, match="misc parameter 'w' is shard.0. on the subscriber"):
        plan_of([param(placement=replicate())], [param(partition_count=4)], bulk=(), misc=("w",))


# -- decoding hostile input ---------------------------------------------------------------------------


def _plan_json() -> dict:
    return json.loads(encode_plan(base_plan()))


def test_deep_nesting_is_refused() -> None:
    body = b'{"publisher":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(PlanError):
        decode_plan(body)
    unknown = b'{"x":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(PlanError):
        decode_plan(unknown)


def test_a_plan_over_the_size_limit_is_refused_before_parsing() -> None:
    with pytest.raises(PlanError, match=f"at most {MAX_PLAN_BYTES}"):
        decode_plan(b" " * (MAX_PLAN_BYTES + 1))


@pytest.mark.parametrize("dim", ["\u0661\u0662", "12", 12.0, True, None, 10**30, 2**50])
def test_a_shape_that_is_not_a_small_positive_integer_is_refused(dim: Any) -> None:
    body = _plan_json()
    body["publisher"]["params"][0]["shape"][0] = dim
    with pytest.raises(PlanError):
        decode_plan(json.dumps(body))
    with pytest.raises(PlanError):
        decode_plan(body)


def test_unknown_fields_and_wrong_types_are_refused_naming_the_field() -> None:
    body = _plan_json()
    body["publisher"]["mesh"]["colour"] = "red"
    with pytest.raises(PlanError, match="colour"):
        decode_plan(body)
    body = _plan_json()
    body["subscriber"]["mesh"]["size"] = "4"
    with pytest.raises(PlanError, match=r"subscriber.mesh.size"):
        decode_plan(body)


def test_not_json_is_refused() -> None:
    with pytest.raises(PlanError, match="not valid JSON"):
        decode_plan(b"{publisher")


def test_a_decoded_plan_runs_every_gate() -> None:
    body = _plan_json()
    body["bulk"] = body["bulk"][1:]
    with pytest.raises(PlanError, match="missing from bulk and misc"):
        decode_plan(body)


@pytest.mark.parametrize(
    ("store", "prefix", "backend", "message"),
    [
        ("127.0.0.1", "p", "gloo", "must be 'host:port'"),
        ("127.0.0.1:\u0661\u0662", "p", "gloo", "must be 'host:port'"),
        ("127.0.0.1:0", "p", "gloo", "port must be in 1..65535"),
        ("127.0.0.1:99999", "p", "gloo", "port must be in 1..65535"),
        ("127.0.0.1:29500", "", "gloo", "prefix must not be empty"),
        ("127.0.0.1:29500", "a/b", "gloo", "must not contain '/'"),
        ("127.0.0.1:29500", "p", "mpi", "backend"),
    ],
)
def test_a_malformed_bootstrap_is_refused(
    store: str, prefix: str, backend: str, message: str
) -> None:
    with pytest.raises(PlanError) as e:
        decode_bootstrap({"store": store, "prefix": prefix, "backend": backend})
    assert message in str(e.value)


def test_a_bootstrap_round_trips() -> None:
    b = decode_bootstrap(json.dumps({"store": "10.0.0.1:29500", "prefix": "r1", "backend": "nccl"}))
    assert b.address == ("10.0.0.1", 29500)
    assert decode_bootstrap(b.as_dict()) == b


# -- the Megatron-style helper -------------------------------------------------------------------


def test_megatron_roles_give_column_row_and_replicated_layouts() -> None:
    params = {p.name: p for p in megatron_params(GENERATOR, TENSORS, ROLES)}
    assert params["l0.qkv"].placement == shard(0) and params["l0.qkv"].partition_count == 4
    assert params["l0.proj"].placement == shard(1) and params["l0.proj"].partition_count == 4
    assert params["norm"].placement == replicate() and params["norm"].partition_count == 1


def test_megatron_refuses_a_parameter_without_a_role() -> None:
    roles = dict(ROLES)
    del roles["l0.qkv"]
    with pytest.raises(PlanError, match=r"no role declared for 'l0.qkv'"):
        megatron_params(GENERATOR, TENSORS, roles)


def test_megatron_refuses_unknown_roles_and_unknown_parameters() -> None:
    with pytest.raises(PlanError, match=r"unknown role 'colum'"):
        megatron_params(GENERATOR, TENSORS, {**ROLES, "embed": "colum"})
    with pytest.raises(PlanError, match=r"do not exist: 'ghost'"):
        megatron_params(GENERATOR, TENSORS, {**ROLES, "ghost": "row"})
    with pytest.raises(PlanError, match=r"l0.proj.bias: a row-parallel parameter"):
        megatron_params(GENERATOR, TENSORS, {**ROLES, "l0.proj.bias": "row"})


# -- the schedule ----------------------------------------------------------------------------------


def _covered_exactly_once(plan: ReshardPlan, lanes: int) -> None:
    """Every element of every subscriber slot's bulk regions arrives exactly once, from a
    publisher slot that holds it."""
    sched = schedule(plan, lanes)
    for name in plan.bulk:
        pp, sp = plan.publisher.param(name), plan.subscriber.param(name)
        for dst in range(plan.subscriber.mesh.size):
            want = plan.subscriber.local_region(sp, dst)
            got: dict[tuple[int, ...], int] = {}
            for piece in sched.pieces:
                if piece.name != name or piece.dst != dst:
                    continue
                assert 0 <= piece.lane < lanes
                held = plan.publisher.local_region(pp, piece.src)
                assert held is not None
                for (lo, hi), (hlo, hhi) in zip(piece.region, held, strict=True):
                    assert hlo <= lo < hi <= hhi
                for idx in itertools.product(*(range(lo, hi) for lo, hi in piece.region)):
                    got[idx] = got.get(idx, 0) + 1
            expected = (
                set()
                if want is None
                else set(itertools.product(*(range(lo, hi) for lo, hi in want)))
            )
            assert set(got) == expected, (name, dst)
            assert all(c == 1 for c in got.values()), (name, dst)
    assert [p.tag for p in sched.pieces] == list(range(len(sched.pieces)))


def test_tp2_to_tp4_sends_each_subscriber_shard_from_the_publisher_that_holds_it() -> None:
    plan = base_plan()
    _covered_exactly_once(plan, 2)
    sched = schedule(plan, 2)
    qkv = [p for p in sched.pieces if p.name == "l0.qkv"]
    assert [(p.src, p.dst) for p in qkv] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    # the replicated bias is taken from both publishers, not one root
    assert {p.src for p in sched.pieces if p.name == "l0.proj.bias"} == {0, 1}


def test_the_schedule_is_deterministic_and_spreads_groups_over_the_lanes() -> None:
    plan = base_plan()
    assert schedule(plan, 3) == schedule(plan, 3)
    lanes = assign_lanes(plan, 3)
    assert set(lanes.values()) == {0, 1, 2}


def test_a_large_replicated_region_is_split_among_its_holders() -> None:
    rows = 4 * SPLIT_MIN_BYTES // 4  # each of 4 subscriber slots wants SPLIT_MIN_BYTES of float32
    big = {"w": ("float32", (rows, 1))}
    plan = make_plan(
        megatron_layout(TRAINER, big, {"w": "replicated"}),
        megatron_layout(GENERATOR, big, {"w": "column"}),
    )
    sched = schedule(plan, 1)
    for dst in range(4):
        got = sorted(sched.received_by(dst), key=lambda p: p.region)
        assert {p.src for p in got} == {0, 1}
        # the pieces tile the slot's rows end to end
        want = plan.subscriber.local_region(plan.subscriber.param("w"), dst)
        assert want is not None
        assert got[0].region[0][0] == want[0][0] and got[-1].region[0][1] == want[0][1]
        assert all(a.region[0][1] == b.region[0][0] for a, b in itertools.pairwise(got))


def test_the_group_key_puts_parameters_on_one_lane() -> None:
    tensors = {f"p{i}": ("float32", (8, 4)) for i in range(6)}
    roles = dict.fromkeys(tensors, "column")
    keys = dict.fromkeys(tensors, "layer0")
    plan = make_plan(
        megatron_layout(TRAINER, tensors, roles, group_keys=keys),
        megatron_layout(GENERATOR, tensors, roles, group_keys=keys),
    )
    assert len({p.lane for p in schedule(plan, 4).pieces}) == 1


def test_misc_payloads_go_one_per_subscriber_in_misc_order() -> None:
    plan = base_plan(misc=("norm", "l0.proj.bias"))
    sched = schedule(plan, 2)
    assert sched.misc_layout == (("norm", 0, 32), ("l0.proj.bias", 32, 16))
    misc = [p for p in sched.pieces if p.is_misc]
    assert [(p.src, p.dst, p.nbytes) for p in misc] == [
        (0, 0, 48),
        (1, 1, 48),
        (0, 2, 48),
        (1, 3, 48),
    ]


def test_lanes_out_of_range_are_refused() -> None:
    with pytest.raises(PlanError, match="lanes must be in 1..64"):
        schedule(base_plan(), 0)


@st.composite
def side(draw: Any, dims: tuple[int, ...], name: str) -> tuple[MeshSpec, ParamPlan]:
    tp = draw(st.sampled_from([1, 2, 4]))
    mesh = MeshSpec(name=name, size=tp * draw(st.integers(1, 2)), tp=tp)
    kind = draw(st.sampled_from(["replicate", "shard"]))
    if kind == "replicate":
        return mesh, ParamPlan(name="w", dtype="float32", shape=dims, placement=replicate())
    dim = draw(st.integers(0, len(dims) - 1))
    counts = [c for c in range(1, tp + 1) if dims[dim] % c == 0]
    count = draw(st.sampled_from(counts))
    offset = draw(st.integers(0, tp - count))
    p = ParamPlan(
        name="w",
        dtype="float32",
        shape=dims,
        placement=shard(dim),
        partition_count=count,
        rank_offset=offset,
    )
    return mesh, p


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_valid_plan_covers_every_subscriber_element_exactly_once(data: Any) -> None:
    dims = tuple(data.draw(st.lists(st.sampled_from([1, 2, 4, 6, 8]), min_size=1, max_size=3)))
    pub_mesh, pub = data.draw(side(dims, "trainer"))
    sub_mesh, sub = data.draw(side(dims, "generator"))
    plan = plan_of([pub], [sub], pub_mesh=pub_mesh, sub_mesh=sub_mesh)
    _covered_exactly_once(plan, data.draw(st.integers(1, 4)))
