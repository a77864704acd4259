"""FastLoadSchema: its load equals marshmallow's own load, value for value and type for type, on random bodies
(valid, nearly valid and malformed); where marshmallow rejects a body, so does the fast load (it declines and
marshmallow reports the errors)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import Schema, ValidationError

from advisor import schemas
from advisor.schemas import ScenarioSchema
from tests.conftest import example_scenario

RUNS = settings(max_examples=800, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# values a client can send in place of any field: the right type and every wrong one
ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 70_000), st.integers(2**60, 2**70),
                st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["", "1.5", "3", "x", "code", "bf16"]),
                st.just([]), st.just({}), st.lists(st.floats(0, 1), max_size=3))


def _perturbed(base: dict) -> st.SearchStrategy:
    """``base`` with some fields replaced by odd values, removed, or an unknown field added, at any depth."""
    def perturb(draw, value: dict) -> dict:
        out = dict(value)
        for key in list(out):
            roll = draw(st.integers(0, 9))
            if roll == 0:
                del out[key]
            elif roll == 1:
                out[key] = draw(ODD)
            elif isinstance(out[key], dict):
                out[key] = perturb(draw, out[key])
        if draw(st.integers(0, 19)) == 0:
            out["unknown_field"] = 1
        return out

    return st.composite(lambda draw: perturb(draw, base))()


def _loads(schema: Schema, body: dict) -> tuple[str, object]:
    try:
        return "ok", Schema.load(schema, body)  # marshmallow's own load, bypassing the fast one
    except ValidationError as exc:
        return "error", exc.messages


def _same(a, b) -> bool:
    """Equal values of equal types (1 and 1.0 differ), dict key order included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _bodies() -> st.SearchStrategy:
    full = example_scenario()
    full.update(slo={"latency_ms": 2000}, load={"requests_per_second": 3}, vram_gb=80, vllm_version="0.24",
                acceptance={"per_position": [0.8, 0.6, 0.5], "draft_fraction": 1})
    open_loop = example_scenario()
    open_loop["workload"] = {**open_loop["workload"], "concurrency": None, "requests_per_second": 2}
    return st.sampled_from([example_scenario(), full, open_loop]).flatmap(_perturbed)


@RUNS
@given(_bodies())
def test_fast_load_equals_marshmallow(body):
    schema = ScenarioSchema()
    body = json.loads(json.dumps(body, allow_nan=True))  # what a JSON parser hands over
    expected = _loads(schema, body)
    try:
        got = ("ok", schema.load(body))
    except ValidationError as exc:
        got = ("error", exc.messages)
    assert got[0] == expected[0] and (_same(got[1], expected[1]) if got[0] == "ok" else got[1] == expected[1])


def test_the_fast_load_is_taken_for_a_valid_body_and_declines_a_bad_one():
    schema = ScenarioSchema()
    fast = schemas._schema_loader(schema)
    assert fast is not None
    good = example_scenario()
    assert _same(fast(good), Schema.load(schema, good))
    for bad in ({**good, "gpu_count": True}, {**good, "gpu_count": 1.0}, {**good, "gpu_hour_usd": "3"},
                {**good, "extra": 1}, {k: v for k, v in good.items() if k != "gpu"},
                {**good, "workload": {**good["workload"], "concurrency": None}}):
        assert fast(bad) is schemas._DECLINE


def test_a_schema_with_hooks_the_fast_load_does_not_know_loads_through_marshmallow():
    from marshmallow import fields, post_load

    class WithHook(schemas.FastLoadSchema):
        x = fields.Integer(strict=True)

        @post_load
        def double(self, data, **_):
            return {"x": data["x"] * 2}

    assert schemas._schema_loader(WithHook()) is None
    assert WithHook().load({"x": 2}) == {"x": 4}


@pytest.mark.parametrize("field", [ScenarioSchema().fields["workload"], ScenarioSchema().fields["acceptance"]])
def test_nested_schemas_are_compiled(field):
    assert schemas._field_loader(field) is not None
