"""A blocking iterator read from an event loop: the generation loop (threads and blocking calls)
behind an asyncio server (the HTTP API under uvicorn, the Ray Serve orchestrator deployment)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator

_END = object()


class ThreadStream:
    """Runs items on a thread of its own and hands what it yields to the event loop (async for).
    stop(), or leaving the async for early, ends it after the item being made (a generation: after
    its current round); the iterator is then closed on its thread, which releases what it holds, and
    on_end runs there. An exception of the iterator is raised by the async for."""

    def __init__(self, items: Iterator, on_end: Callable[[], None] = lambda: None, name: str = "specpipe-stream"):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._stopped = threading.Event()
        threading.Thread(target=self._run, args=(items, on_end), name=name, daemon=True).start()

    def _run(self, items: Iterator, on_end: Callable[[], None]) -> None:
        error = None
        try:
            for item in items:
                self._put((item, None))
                if self._stopped.is_set():
                    break
        except BaseException as err:  # noqa: BLE001 - raised again on the event loop, whatever it is
            error = err
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
            on_end()
            self._put((_END, error))

    def _put(self, entry: tuple) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, entry)

    def stop(self) -> None:
        self._stopped.set()

    async def __aiter__(self) -> AsyncIterator:
        try:
            while True:
                item, error = await self._queue.get()
                if item is _END:
                    if error is not None:
                        raise error
                    return
                yield item
        finally:
            self.stop()
