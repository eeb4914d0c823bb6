"""The longest tests run first: pytest-xdist hands out tests in collection order (after the
`xdist_group`s, largest first), so a long test collected late starts when the others are
nearly done and the whole run waits for it alone. A test missing from `LONGEST` keeps its
place; a name here that no longer exists is ignored."""

from __future__ import annotations

import pytest

# The longest under `make test` on two cores (`--durations`), longest first.
LONGEST = (
    "tests/test_observe_genai.py::test_the_genai_instrumentations_calls_each_in_its_window_"
    "live_as_from_the_file",
    "tests/test_predict_check.py::test_a_run_that_did_not_stream_is_checked_on_e2e_only",
    "tests/test_ab.py::test_a_real_prefix_cache_effect_is_found_and_attributed",
    "tests/test_server_openapi.py::test_schemathesis_with_every_check_finds_nothing",
    "tests/test_tune.py::test_tune_screens_in_the_simulator_and_measures_the_best_predicted_gain",
    "tests/test_predict_trust.py::test_past_capacity_the_interval_says_the_queue_grows",
    "tests/test_predict.py::test_predict_replays_a_run_and_sizes_a_fleet",
    "tests/test_observe.py::test_a_collectors_file_of_a_day_with_a_peak",
    "tests/test_predict_intervals.py::test_on_a_calm_host_the_intervals_below_capacity_are_"
    "narrow",
    "tests/test_ab.py::test_ab_alternates_the_sides_on_the_same_workload_and_finds_the_slower",
    "tests/test_ab.py::test_an_a_a_ab_against_a_caching_server_finds_no_change",
    "tests/test_predict.py::test_calibrate_from_a_run_folder_recovers_the_server",
    "tests/test_predict_trust.py::test_check_sets_measured_runs_against_the_intervals",
    "tests/test_sweep_engine.py::test_ctrl_c_keeps_the_finished_points_and_stops_the_one_engine",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {nodeid: i for i, nodeid in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(LONGEST)))  # stable: others keep order
