"""Every input the fuzzers found a crash with, replayed (sip-fixtures/fuzz-regressions/), and
the fixes they led to checked on their own; plus proof that the fuzz checks can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.sip.limits import Refusal
from voxgate.bench import fuzz
from voxgate.bench.fuzz import REGRESSIONS, TARGETS, FuzzFailure

CASES = sorted(
    (d.name, p) for d in REGRESSIONS.iterdir() if d.is_dir() for p in d.iterdir() if p.is_file()
)


def test_every_regression_names_a_target() -> None:
    assert CASES, "no regression fixtures found"
    assert {name for name, _ in CASES} <= set(TARGETS)


@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_regression_input_meets_the_contract(target: str, path: Path) -> None:
    TARGETS[target].check(path.read_bytes())


def test_quick_refusal_unfolds_continuation_lines() -> None:
    """A 503 built from a shed INVITE's raw lines keeps its folded To and Via whole (RFC 3261
    §7.3.1): before the fix the To lost its URI and the Via its sent-by."""
    from gateway.sip.layer import quick_refusal
    from gateway.sip.message import Response, parse

    data = (REGRESSIONS / "sip-layer" / "folded-headers-quick-refusal").read_bytes()
    reply = quick_refusal(data, Refusal("rate", drop=False, retry_after_s=5))
    assert reply is not None
    response = parse(reply)
    assert isinstance(response, Response) and response.status == 503
    assert str(response.to_addr.uri) == "sip:vivekg@chair-dnrc.example.com"
    assert response.to_addr.tag == "1918181833n"
    assert response.top_via.host == "192.0.2.2"


def test_deep_json_is_a_400_not_a_500() -> None:
    """``[`` x 3000 made json.loads raise RecursionError, which no reader caught."""
    from aiohttp.test_utils import make_mocked_request  # noqa: F401  (the target needs aiohttp)

    with pytest.raises(RecursionError):
        json.loads(b"[" * 3000)
    fuzz.check_api_body(bytes([0, 7]) + b"[" * 3000)  # raises FuzzFailure on a 500


def test_lone_surrogate_offer_is_refused() -> None:
    from gateway.legs.webrtc.offer import OfferError, check_offer

    with pytest.raises(OfferError, match="lone surrogate"):
        check_offer({"type": "offer", "sdp": "v=0\r\n\ud800"})


def test_bus_entry_with_a_non_utf8_field_name_is_a_schema_error_or_ignored() -> None:
    from voxgate.contract.bus.schema import SchemaError, SpeakRequest

    with pytest.raises(SchemaError, match="missing field"):
        SpeakRequest.from_fields({b"\x80": b"x", b"v": b"1"})
    fields = {k.encode(): v.encode() for k, v in SpeakRequest("c", "u", "hi").to_fields().items()}
    assert SpeakRequest.from_fields({**fields, b"\xff": b"?"}) == SpeakRequest("c", "u", "hi")


# --- the checks are not vacuous -----------------------------------------------------------------
def test_a_parser_raising_the_wrong_type_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway import sdp

    def broken(data: bytes | str) -> sdp.SessionDescription:
        raise IndexError("list index out of range")

    monkeypatch.setattr(sdp, "parse", broken)
    with pytest.raises(IndexError):
        fuzz.check_sdp(b"v=0\r\n")


def test_a_broken_round_trip_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.rtp.dtmf import TelephoneEvent

    real = TelephoneEvent.__bytes__
    monkeypatch.setattr(TelephoneEvent, "__bytes__", lambda self: real(self)[:3] + b"\x01")
    with pytest.raises(FuzzFailure, match="parse"):
        fuzz.check_dtmf(b"\x05\x8a\x03\x20")


def test_a_leaked_key_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway import sdp_crypto

    real = sdp_crypto.parse_crypto

    def leaky(value: str) -> sdp_crypto.CryptoAttribute:
        try:
            return real(value)
        except sdp_crypto.CryptoError:
            raise sdp_crypto.CryptoError(f"bad: {value}") from None

    monkeypatch.setattr(sdp_crypto, "parse_crypto", leaky)
    key = "WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz"
    with pytest.raises(FuzzFailure, match="the key is in"):
        fuzz.check_sdp_crypto(f"\x011 AES_CM_128_HMAC_SHA1_80 inline:{key}|2^99".encode())
