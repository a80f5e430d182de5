"""RenderCache: bounded in bytes, least recently used out, oversize renderings refused."""

from __future__ import annotations

from synth.cache import CachedChunk, RenderCache, Rendering


def rendering(nbytes: int) -> Rendering:
    return Rendering(8000, (CachedChunk(b"\0" * nbytes, 0, ()),), nbytes // 2)


def key(text: str) -> tuple[str, bool, str, str, str]:
    return (text, False, "v", "narrowband", "onnx")


def test_lru_eviction_by_bytes() -> None:
    c = RenderCache(max_bytes=300)
    c.put(key("a"), rendering(100))
    c.put(key("b"), rendering(100))
    assert c.get(key("a")) is not None  # a is now the most recent
    c.put(key("c"), rendering(150))  # over budget: b (least recent) goes
    assert c.get(key("b")) is None
    assert c.get(key("a")) is not None and c.get(key("c")) is not None
    assert c.nbytes == 250 and len(c) == 2
    assert (c.hits, c.misses) == (3, 1)


def test_oversize_rendering_is_not_stored_and_flushes_nothing() -> None:
    c = RenderCache(max_bytes=300)
    c.put(key("a"), rendering(100))
    c.put(key("huge"), rendering(400))
    assert c.get(key("huge")) is None and c.get(key("a")) is not None


def test_replacing_a_key_keeps_the_byte_count_right() -> None:
    c = RenderCache(max_bytes=1000)
    c.put(key("a"), rendering(100))
    c.put(key("a"), rendering(200))
    assert c.nbytes == 200 and len(c) == 1
