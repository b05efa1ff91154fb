"""``daemon.simulator.__all__`` is honest: every name exists and is public API."""

from __future__ import annotations

import daemon.simulator as simulator


def test_all_names_exist_and_are_listed_once() -> None:
    assert len(simulator.__all__) == len(set(simulator.__all__))
    for name in simulator.__all__:
        assert hasattr(simulator, name), name


def test_every_public_class_and_function_is_exported() -> None:
    public = {
        name
        for name, value in vars(simulator).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("daemon.simulator.")
    }
    assert public <= set(simulator.__all__)
