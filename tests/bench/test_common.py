"""bench/common.py helpers: interleaved rounds, median and range, capacity search."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench.loader import load_bench

common = load_bench("common")


def test_interleaved_rounds_reverse_the_order_every_other_round() -> None:
    calls: list[str] = []
    counter = {"a": 0, "b": 0, "c": 0}

    def arm(name: str, scale: float):  # type: ignore[no-untyped-def]
        def run() -> float:
            calls.append(name)
            counter[name] += 1
            return scale * counter[name]

        return run

    seen: list[tuple[int, dict[str, float]]] = []
    out = common.interleaved_rounds(
        {"a": arm("a", 1.0), "b": arm("b", 10.0), "c": arm("c", 100.0)},
        rounds=4,
        on_round=lambda r, v: seen.append((r, dict(v))),
    )
    assert calls == list("abccbaabccba")
    assert out == {"a": [1, 2, 3, 4], "b": [10, 20, 30, 40], "c": [100, 200, 300, 400]}
    assert [r for r, _ in seen] == [0, 1, 2, 3]
    assert seen[1][1] == {"a": 2.0, "b": 20.0, "c": 200.0}


def test_interleaved_rounds_stop_when_keep_going_says_so() -> None:
    asked: list[int] = []

    def keep_going(done: int) -> bool:
        asked.append(done)
        return done < 2

    out = common.interleaved_rounds({"a": lambda: 1.0, "b": lambda: 2.0}, 5, keep_going=keep_going)
    assert out == {"a": [1.0, 1.0], "b": [2.0, 2.0]}
    assert asked == [1, 2]


def test_median_range_and_ratios_match_plain_numpy() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 6):
        v = rng.exponential(size=n)
        s = common.median_range(v)
        assert s["median"] == float(np.median(v))
        assert (s["min"], s["max"]) == (float(v.min()), float(v.max()))
        assert s["rounds"] == [float(x) for x in v]
    assert common.ratios([2.0, 9.0, 1.0], [1.0, 3.0, 4.0]) == [2.0, 3.0, 0.25]
    inf, nan = common.ratios([5.0, 0.0], [0.0, 0.0])
    assert inf == float("inf") and np.isnan(nan)
    targets = common.Targets()
    targets.check("ratio", nan, 5.0)
    assert targets.rows[0]["met"] is False
    with pytest.raises(ValueError, match="2 numerators for 3"):
        common.ratios([1.0, 2.0], [1.0, 2.0, 3.0])
    s = common.median_range([1.0, 3.0, 2.0])
    assert common.fmt_range(s, ".1f", "x") == "2.0x [1.0-3.0]"


def _check_bracket(cap, passes) -> None:  # type: ignore[no-untyped-def]
    """The reported rates were probed with the stated outcome, and bracket within 10%."""
    assert (cap.rate, True) in cap.probes
    assert (cap.first_fail, False) in cap.probes
    assert cap.rate < cap.first_fail <= 1.1 * cap.rate
    assert all(passes(r) == ok for r, ok in cap.probes)


@pytest.mark.parametrize("start", [1.0, 50.0, 100.0, 5000.0])
@pytest.mark.parametrize("capacity", [3.0, 99.0, 150.0, 1004.0, 2500.0])
def test_find_capacity_brackets_a_threshold_within_tolerance(start: float, capacity: float) -> None:
    def passes(rate: float) -> bool:
        return rate <= capacity

    for factor in (2.0, 1.2):
        cap = common.find_capacity(passes, start, factor=factor, tolerance=0.1)
        _check_bracket(cap, passes)
        assert cap.rate <= capacity < cap.first_fail
        ladder = np.ceil(abs(np.log(capacity / start)) / np.log(factor)) + 1
        bisection = np.ceil(np.log2(np.log(factor) / np.log(1.1)))
        assert len(cap.probes) <= ladder + bisection


def test_find_capacity_with_a_noisy_pass_function_still_returns_a_probed_bracket() -> None:
    rng = np.random.default_rng(0)
    outcomes: dict[float, bool] = {}

    def passes(rate: float) -> bool:  # mostly monotone, 20% of answers flipped
        if rate not in outcomes:
            outcomes[rate] = (rate <= 300) != (rng.random() < 0.2)
        return outcomes[rate]

    for start in (10.0, 100.0, 1000.0):
        _check_bracket(common.find_capacity(passes, start, max_rate=1e6), passes)


def test_find_capacity_edges() -> None:
    none = common.find_capacity(lambda r: False, 100.0, factor=2.0, min_rate=1.0)
    assert none.rate == 0.0 and none.first_fail is not None and none.first_fail < 2.0
    assert all(not ok for _, ok in none.probes)
    every = common.find_capacity(lambda r: True, 100.0, max_rate=1000.0)
    assert every.rate == 1000.0 and every.first_fail is None
    assert [r for r, _ in every.probes] == [100.0, 200.0, 400.0, 800.0, 1000.0]
    for bad in ({"start": 0.0}, {"start": 1.0, "factor": 1.0}, {"start": 1.0, "tolerance": 0.0}):
        with pytest.raises(ValueError):
            common.find_capacity(lambda r: True, **bad)


def test_result_name_keeps_full_results_apart_from_quick_ones() -> None:
    assert common.result_name("sampling", False) == "sampling"
    assert common.result_name("sampling", True) == "sampling_quick"


def test_results_are_strict_json(tmp_path, monkeypatch) -> None:
    import json

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    payload = {
        "p99": float("nan"),
        "ratio": np.float64("inf"),
        "n": np.int64(3),
        "t": (1.5, -np.inf),
    }
    path = common.write_results("x", payload)
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert (doc["p99"], doc["ratio"], doc["n"], doc["t"]) == (None, None, 3, [1.5, None])


def test_pyg_backend_switches_the_sampler_and_restores_it(monkeypatch) -> None:
    typing = pytest.importorskip("torch_geometric.typing")
    monkeypatch.setattr(typing, "WITH_PYG_LIB", True)  # as with pyg-lib installed
    before = typing.WITH_PYG_LIB
    with common.pyg_backend("torch-sparse"):
        assert typing.WITH_PYG_LIB is False
    assert before == typing.WITH_PYG_LIB
    with pytest.raises(ValueError, match="pyg-lib"), common.pyg_backend("dgl"):
        pass
