"""Hook logic written once for the sync and the async hook: steps, run by two drivers.

A behaviour's logic is a generator: it yields each call it needs made (the next handler, a
registered hook, a model), receives the answer, and returns the hook's result. :func:`drive`
answers with sync calls, :func:`adrive` with async ones, so the sync and async hooks are
one-line shells over the same generator. An exception a call raises is thrown into the
generator where it yielded: a ``try``/``except`` around a ``yield`` reads like one around
the call.

Example::

    def _steps(self, request):
        try:
            return (yield request)  # the handler's response
        except OverflowError:
            return (yield self.smaller(request))  # retry once

    def wrap_model_call(self, request, handler):
        return drive(self._steps(request), handler)

    async def awrap_model_call(self, request, handler):
        return await adrive(self._steps(request), handler)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Generic, Self, TypeVar, cast

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

Ask = TypeVar("Ask")
Answer = TypeVar("Answer")
Result = TypeVar("Result")

ModelAsk = tuple[BaseChatModel, Sequence[BaseMessage]]
"""A model call a generator asks for: the model and its input."""


class _Run(Generic[Ask, Answer, Result]):
    """Iterates the calls a generator asks for; ``with run:`` around a call hands its answer,
    or its exception, to the next step. ``value`` is what the generator returned."""

    __slots__ = ("answer", "error", "steps", "value")

    def __init__(self, steps: Generator[Ask, Answer, Result]) -> None:
        self.steps = steps
        self.answer = cast(Answer, None)  # the first send must be None
        self.error: BaseException | None = None

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Ask:
        error, self.error = self.error, None
        try:
            return self.steps.send(self.answer) if error is None else self.steps.throw(error)
        except StopIteration as done:
            self.value: Result = done.value
            raise StopIteration from None

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        self.error = exc  # thrown into the generator by the next step
        return exc is not None


def drive(steps: Generator[Ask, Answer, Result], call: Callable[[Ask], Answer]) -> Result:
    """Run ``steps`` to the end, answering each value it yields with ``call(value)``."""
    run = _Run(steps)
    for ask in run:
        with run:
            run.answer = call(ask)
    return run.value


async def adrive(
    steps: Generator[Ask, Answer, Result], call: Callable[[Ask], Awaitable[Answer]]
) -> Result:
    """Run ``steps`` to the end, answering each value it yields with ``await call(value)``."""
    run = _Run(steps)
    for ask in run:
        with run:
            run.answer = await call(ask)
    return run.value


def invoke_model(ask: ModelAsk) -> AIMessage:
    """Answer a :data:`ModelAsk` with the model's sync ``invoke``."""
    model, messages = ask
    return model.invoke(messages)


async def ainvoke_model(ask: ModelAsk) -> AIMessage:
    """Answer a :data:`ModelAsk` with the model's ``ainvoke``."""
    model, messages = ask
    return await model.ainvoke(messages)


ModelCall = Generator[ModelRequest[Any], ModelResponse[Any], ModelResponse[Any]]
"""A model call as steps: yields each request for the model, returns the response."""


class ModelCallSteps:
    """Mixin for a middleware whose ``wrap_model_call`` logic is steps.

    The middleware defines :meth:`_model_call`; this mixin's sync and async wrap hooks run
    it, answering each request it yields with the next handler. List it before
    ``AgentMiddleware`` among the bases.
    """

    def _model_call(self, request: ModelRequest[Any]) -> ModelCall:
        raise NotImplementedError

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return drive(self._model_call(request), handler)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await adrive(self._model_call(request), handler)
