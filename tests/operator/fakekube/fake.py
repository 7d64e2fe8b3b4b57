"""`FakeKube`: the fake API server on a background thread, with helpers the tests use."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from .kubelet import Kubelet
from .server import Api, Faults
from .store import Store

T = TypeVar("T")


class FakeKube:
    """Serve a `Store` over HTTP on 127.0.0.1 from a thread with its own event loop."""

    def __init__(self, validator_factory: Any = None) -> None:
        self.faults = Faults()
        self._validator_factory = validator_factory
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fakekube", daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.store: Store
        self.api: Api
        self.kubelet: Kubelet

    def start(self) -> FakeKube:
        self._thread.start()
        self.url = self.call_async(self._start())
        return self

    async def _start(self) -> str:
        self.store = Store(self._validator_factory)
        self.api = Api(self.store, self.faults)
        self.kubelet = Kubelet(self.store)
        self._runner = web.AppRunner(self.api.app(), handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self._runner is not None:
            self.call_async(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's loop (the store is not thread-safe) and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.call_async(wrapper())

    def call_async(self, coro: Any) -> Any:
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=30)

    def write_kubeconfig(self, path: pathlib.Path, namespace: str = "default") -> pathlib.Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n"
            "users:\n- name: fake\n  user:\n    token: fake-token\n"
        )
        return path
