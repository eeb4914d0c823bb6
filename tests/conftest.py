"""The suite's order: the modules of its longest tests first, so that with the workers of
`-n` (pyproject.toml) they start at once instead of last, where they would be the run's
tail; the rest keep their order."""

LONGEST_FIRST = ("test_server_openapi.py", "test_ray.py", "test_predict.py", "test_ab.py",
                 "test_conformance.py", "test_observe.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))
