"""How pytest-xdist (`--dist loadgroup`) shares the tests out over its workers:

* the tests of a module in `COSTLY_SETUP` that use one of its module-scoped fixtures (a
  server, an engine's run, a built site) go to one worker (an `xdist_group` of the module),
  which sets it up once; spread over four workers it was set up as many as four times (a
  module whose fixture is cheap is left spread: its tests run side by side);
* the longest tests run first: xdist hands out tests (a group's all at once) in collection
  order (`--no-loadscope-reorder` in pyproject: not the largest group first), so a long test
  collected late starts when the others are nearly done and the whole run waits for it
  alone. A test missing from `LONGEST` keeps its place; a name here that no longer exists
  is ignored."""

from __future__ import annotations

import pytest

# Modules whose module-scoped fixture takes seconds of CPU to set up.
COSTLY_SETUP = (
    "tests/test_advice_effects.py",  # a bench run against latlab serve
    "tests/test_docs.py",  # mkdocs build
    "tests/test_server_api.py",  # latlab serve
    "tests/test_server_faults.py",
    "tests/test_server_guards.py",
    "tests/test_server_preprocess.py",
)
# The longest under `make test` on two cores (`--durations`), longest first: a test, or a
# module (all of its tests: a group's).
LONGEST = (
    "tests/test_observe_genai.py::test_the_genai_instrumentations_calls_each_in_its_window_"
    "live_as_from_the_file",
    "tests/test_gateway_real.py",
    "tests/test_ray.py",
    "tests/test_predict_check.py::test_a_run_that_did_not_stream_is_checked_on_e2e_only",
    "tests/test_ab.py::test_a_real_prefix_cache_effect_is_found_and_attributed",
    "tests/test_server_openapi.py::test_schemathesis_with_every_check_finds_nothing",
    "tests/test_tune.py::test_tune_screens_in_the_simulator_and_measures_the_best_predicted_gain",
    "tests/test_advice_effects.py",
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
    "tests/test_docs.py",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in COSTLY_SETUP and item.get_closest_marker("xdist_group") is None \
                and _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module))
    rank = {name: i for i, name in enumerate(LONGEST)}

    def place(item: pytest.Item) -> int:
        return rank.get(item.nodeid, rank.get(item.nodeid.split("::")[0], len(LONGEST)))

    items.sort(key=place)  # stable: the others keep their order
    result = yield  # the other plugins' hooks, xdist's among them
    if getattr(config.option, "loadgroup", False):
        _group_node_ids(items)
    return result


def _group_node_ids(items: list[pytest.Item]) -> None:
    """What pytest-xdist 3.8 does for `--dist loadgroup`, where it fails to: it names a
    test's group in its node id (`test_x@group`, which its scheduler reads), by assigning
    `item._nodeid`, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386): every
    group was spread over the workers. Set where pytest 9.2 keeps the id; nothing to do
    where xdist's own assignment took."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # a pytest that moved it: leave the ids, as before this workaround
        return

    for item in items:
        groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                  for m in item.iter_markers("xdist_group")}
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(groups))}")


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # a test function's; a doctest has none
    return info is not None and any(
        d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)
