"""``function:NAME`` specs: a function this process registered, and nothing else."""

from __future__ import annotations

import pytest

from lodger.errors import ConfigError
from lodger.providers import FunctionModel, make_model, register_function
from lodger.providers.base import ModelRequest, UserMessage


async def test_a_registered_function_is_a_model_spec() -> None:
    register_function("spec-echo", lambda request: f"you said {request.messages[-1].text}")  # type: ignore[union-attr]
    model = make_model("function:spec-echo")
    assert isinstance(model, FunctionModel) and model.spec == "function:spec-echo"
    answer = await model.complete(ModelRequest(system="", messages=[UserMessage(text="hi")]))
    assert answer.text == "you said hi"
    # a fallback chain of registered functions
    register_function("spec-other", lambda request: "other")
    assert make_model("function:spec-echo|function:spec-other").spec.count("function:") == 2


@pytest.mark.parametrize("spec", ["function:never-registered", "function:os.path:join"])
def test_a_spec_never_imports_what_nobody_registered(spec: str) -> None:
    with pytest.raises(ConfigError, match="no model function is registered"):
        make_model(spec)


@pytest.mark.parametrize("name", ["", "a:b", "a|b"])
def test_a_name_that_cannot_be_a_spec_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="not usable in a spec"):
        register_function(name, lambda request: "x")
