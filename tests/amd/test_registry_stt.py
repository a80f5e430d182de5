"""``AgentRegistry.stt``: the recogniser AMD's word rule may use, only once it is loaded (AMD
never loads it itself)."""

from __future__ import annotations

from gateway.agents.registry import AgentRegistry
from tests.agents.test_registry import BASE_URL, Loader, config


async def test_stt_is_there_only_once_loaded() -> None:
    loader = Loader()
    reg = AgentRegistry(config(llm__base_url=BASE_URL), ears_loader=loader)
    try:
        await reg.warm()  # the default agent is the IVR: nothing loaded
        assert reg.stt is None and loader.loads == 0
        ears = await reg.ears()  # an llm call loads it
        assert reg.stt is ears.stt and loader.loads == 1
    finally:
        await reg.close()
    reg = AgentRegistry(config(agent__kind="llm", llm__base_url=BASE_URL), ears_loader=Loader())
    try:
        await reg.warm()  # the llm default: loaded at start, there for every call
        assert reg.stt is not None
    finally:
        await reg.close()
