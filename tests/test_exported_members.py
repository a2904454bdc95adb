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
