"""The public surface: ``lodger.__all__`` is complete, sorted and importable."""

import lodger


def test_all_is_sorted_and_unique() -> None:
    assert list(lodger.__all__) == sorted(set(lodger.__all__))


def test_every_exported_name_exists() -> None:
    for name in lodger.__all__:
        assert hasattr(lodger, name), name


def test_every_public_attribute_is_exported() -> None:
    for name in lodger.__all__:  # exports load on first use: load them all
        getattr(lodger, name)
    public = {
        name
        for name, value in vars(lodger).items()
        if not name.startswith("_") and not isinstance(value, type(lodger))
    }
    assert public == set(lodger.__all__)


def test_lazy_exports_are_values_not_the_modules_that_define_them() -> None:
    """An export named like a submodule of its package would be that module once the
    submodule is imported (the import system binds it on the package, and ``__getattr__``
    is then never asked): ``from lodger.runtime import Overrides, compose`` gave the
    module ``lodger.runtime.compose``."""
    import importlib
    import types

    for package in (
        "lodger",
        "lodger.runtime",
        "lodger.substrates.sandbox",
        "lodger.runtime.subagents",
    ):
        module = importlib.import_module(package)
        for name, where in vars(module)["_EXPORTS"].items():
            importlib.import_module(where)  # as any other import of it would
            assert not isinstance(getattr(module, name), types.ModuleType), (package, name)
