"""Run the core's processes on asyncio: the runtime twin of ``sim.backend.SimBackend._drive``.

Each core process becomes an asyncio task. The effect it yields is awaited on its handler
(a coroutine that calls Ray actors); the result is sent back. ``Abort`` cancels the target
tasks: the cancellation surfaces in the generator as :class:`~rollart.core.effects.Aborted` at
the effect it was waiting on, and the handler's own ``except CancelledError`` ABORTs the
in-flight work (e.g. the generation request on its engine)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Generator, Hashable

from rollart.core.effects import Abort, Aborted, AcquireEnv, Sleep, Spawn, Wait

Handler = Callable[[Any], Awaitable[Any]]


class AsyncDriver:
    def __init__(self, handlers: dict[type, Handler]):
        # Env workers host any number of envs, so by default there is no env slot to wait for.
        self.handlers: dict[type, Handler] = {Wait: self._wait, Sleep: self._sleep, Spawn: self._spawn,
                                              Abort: self._abort, AcquireEnv: self._nothing, **handlers}
        self.tasks: dict[Hashable, asyncio.Task] = {}
        self.all_tasks: set[asyncio.Task] = set()
        self.effects_handled = 0
        self.failures: list[BaseException] = []
        self._abort_reason: dict[asyncio.Task, str] = {}

    def spawn(self, gen: Generator[Any, Any, Any], key: Hashable | None = None) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._drive(gen, key))
        self.all_tasks.add(task)
        task.add_done_callback(self._finished)
        if key is not None:
            self.tasks[key] = task
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self.all_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failures.append(task.exception())  # surfaced by the backend, never swallowed

    async def _drive(self, gen: Generator[Any, Any, Any], key: Hashable | None) -> Any:
        send: Any = None
        throw: BaseException | None = None
        me = asyncio.current_task()
        try:
            while True:
                try:
                    effect = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    return stop.value
                throw = None
                self.effects_handled += 1
                try:
                    send = await self.handlers[type(effect)](effect)
                except asyncio.CancelledError:
                    reason = self._abort_reason.pop(me, None) if me is not None else None
                    if reason is None:
                        raise  # the run itself is shutting down
                    me.uncancel()  # type: ignore[union-attr]
                    send, throw = None, Aborted(reason)
        finally:
            if key is not None and self.tasks.get(key) is me:
                del self.tasks[key]

    # ---- control effects -------------------------------------------------------------------

    async def _wait(self, eff: Wait) -> Any:
        fut = asyncio.get_running_loop().create_future()
        eff.signal.add_waiter(lambda value: fut.set_result(value) if not fut.done() else None)
        return await fut

    async def _nothing(self, eff: Any) -> None:
        return None

    async def _sleep(self, eff: Sleep) -> None:
        await asyncio.sleep(eff.seconds)

    async def _spawn(self, eff: Spawn) -> None:
        self.spawn(eff.process, eff.key)

    async def _abort(self, eff: Abort) -> None:
        me = asyncio.current_task()
        for traj in eff.trajs:
            task = self.tasks.get(traj.id)
            if task is not None and task is not me and not task.done():
                self._abort_reason[task] = eff.reason
                task.cancel(eff.reason)

    async def cancel_all(self) -> None:
        """Stop every process still running (end of the run), and any a stopping one spawned on
        its way out (an env manager that closes starts its next trajectory)."""
        while self.all_tasks:
            tasks = list(self.all_tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
