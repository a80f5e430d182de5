"""Contacts from CSV and JSON: every bad row reported with its number, nothing half-valid."""

from __future__ import annotations

import json

import pytest

from gateway.campaign.contacts import (
    Contact,
    ContactLimits,
    ContactsError,
    normalise_to,
    parse_contacts_csv,
    parse_contacts_json,
)


def _rows(exc: pytest.ExceptionInfo[ContactsError]) -> dict[int | None, str]:
    return {e.row: e.reason for e in exc.value.errors}


def test_a_valid_csv_with_vars() -> None:
    text = (
        "to,name,plan\r\n"
        "+1 (555) 010-2030,Dana,gold\r\n"
        'sip:Bob@Example.COM;transport=tcp,"Bob, Jr.",silver\r\n'
        "sips:+4930123456@trunk.example,,\r\n"
        "\r\n"
    )
    contacts = parse_contacts_csv(text.encode())
    assert contacts == [
        Contact("+15550102030", {"name": "Dana", "plan": "gold"}),
        Contact("sip:Bob@example.com;transport=tcp", {"name": "Bob, Jr.", "plan": "silver"}),
        Contact("sips:+4930123456@trunk.example", {"name": "", "plan": ""}),
    ]


def test_csv_bad_rows_are_all_reported_with_their_line_numbers() -> None:
    text = (
        "name,to\n"  # line 1: header, 'to' need not be first
        "ok,+15550100001\n"  # 2
        "local,5550100\n"  # 3: no '+'
        "short,+1234567\n"  # 4: 7 digits
        "long,+1234567890123456\n"  # 5: 16 digits
        "letters,+1555CALLNOW\n"  # 6
        "http,http://example.com\n"  # 7: not sip
        "badsip,sip:bob@\n"  # 8: empty host
        "cells,+15550100002,extra\n"  # 9: 3 cells
        "dup,+1 555 010 0001\n"  # 10: duplicate of line 2 after normalising
        "empty,\n"  # 11
        '"multi\nline",+15550100003\n'  # 12-13: a quoted newline; the row ends on line 13
        "zero,+0123456789\n"  # 14
    )
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv(text)
    rows = _rows(exc)
    assert sorted(r for r in rows if r is not None) == [3, 4, 5, 6, 7, 8, 9, 10, 11, 14]
    assert "E.164" in rows[3] and "'+'" in rows[3]
    assert "7 digits" in rows[4]
    assert "16 digits" in rows[5]
    assert "only digits" in rows[6]
    assert "neither a sip:/sips: URI nor an E.164" in rows[7]
    assert "not a valid SIP URI" in rows[8]
    assert "3 cells" in rows[9]
    assert rows[10] == "duplicate of row 2 (+15550100001)"
    assert "empty" in rows[11]
    assert "country code" in rows[14]


def test_csv_header_problems() -> None:
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("number,name\n+15550100001,x\n")
    assert _rows(exc) == {1: "the header row has no 'to' column"}
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to,name,name\n+15550100001,x,y\n")
    assert "repeated column(s) 'name'" in _rows(exc)[1]
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("")
    assert None in _rows(exc)
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to\n\n")
    assert _rows(exc) == {None: "no contacts"}
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv(b"to\n\xff\xfe\n")
    assert "UTF-8" in _rows(exc)[None]


def test_sip_uri_duplicates_compare_scheme_and_host_case_insensitively() -> None:
    with pytest.raises(ContactsError) as exc:
        parse_contacts_json([{"to": "sip:alice@EXAMPLE.com"}, {"to": "SIP:alice@example.COM"}])
    assert _rows(exc) == {1: "duplicate of row 0 (sip:alice@example.com)"}
    # The user part is case-sensitive (RFC 3261 §19.1.4): these are two contacts.
    got = parse_contacts_json(["sip:alice@example.com", "sip:Alice@example.com"])
    assert [c.to for c in got] == ["sip:alice@example.com", "sip:Alice@example.com"]


def test_json_bad_items_are_reported_with_their_index() -> None:
    items: list[object] = [
        {"to": "+15550100001", "vars": {"name": "Dana", "n": 3, "vip": True}},
        {"to": "+15550100001"},  # 1 duplicate
        {"vars": {}},  # 2 no to
        {"to": 15550100002},  # 3 not a string
        {"to": "+15550100003", "vars": ["a"]},  # 4 vars not an object
        {"to": "+15550100004", "vars": {"x": {"deep": 1}}},  # 5 nested value
        {"to": "+15550100005", "extra": 1},  # 6 unknown field
        42,  # 7
        {"to": "tel:+15550100006"},  # 8 tel: is not accepted
    ]
    with pytest.raises(ContactsError) as exc:
        parse_contacts_json(json.dumps(items))
    rows = _rows(exc)
    assert sorted(r for r in rows if r is not None) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rows[1] == "duplicate of row 0 (+15550100001)"
    assert "'to' is missing" in rows[2] and "'to' is missing" in rows[3]
    assert "'vars' must be an object" in rows[4]
    assert "var 'x'" in rows[5]
    assert "unknown field(s) 'extra'" in rows[6]
    assert "must be an object" in rows[7]
    assert "tel:" in rows[8]
    assert "8 bad contact row(s)" in str(exc.value)


def test_json_values_become_strings() -> None:
    got = parse_contacts_json([{"to": "+15550100001", "vars": {"n": 3, "vip": True, "x": 1.5}}])
    assert got == [Contact("+15550100001", {"n": "3", "vip": "true", "x": "1.5"})]


def test_json_that_is_not_a_list_or_not_json() -> None:
    with pytest.raises(ContactsError) as exc:
        parse_contacts_json(b'{"to": "+15550100001"}')
    assert None in _rows(exc)
    with pytest.raises(ContactsError) as exc:
        parse_contacts_json(b"[{")
    assert "not JSON" in _rows(exc)[None]


def test_limits() -> None:
    limits = ContactLimits(max_contacts=3, max_bytes=200, max_vars=2, max_value_len=5)
    many = [f"+1555010000{i}" for i in range(4)]
    with pytest.raises(ContactsError) as exc:
        parse_contacts_json(many, limits)
    assert _rows(exc) == {None: "more than 3 contacts"}
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to\n" + "\n".join(many) + "\n", limits)
    assert _rows(exc) == {None: "more than 3 contacts"}
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to,x\n" + "+15550100001," + "y" * 300 + "\n", limits)
    assert "at most 200" in _rows(exc)[None]
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to,a,b,c\n+15550100001,1,2,3\n+15550100002,1,2,3\n", limits)
    assert _rows(exc) == {2: "3 vars, at most 2", 3: "3 vars, at most 2"}
    with pytest.raises(ContactsError) as exc:
        parse_contacts_csv("to,a\n+15550100001,123456\n", limits)
    assert _rows(exc) == {2: "var 'a' is 6 characters, at most 5"}
    assert len(parse_contacts_json(many[:3], limits)) == 3


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("+44 20 7946 0958", "+442079460958"),
        ("+1.555.010.2030", "+15550102030"),
        ("sips:Alice@Atlanta.Example.com:5061", "sips:Alice@atlanta.example.com:5061"),
        ("sip:10.0.0.1", "sip:10.0.0.1"),
    ],
)
def test_normalise(raw: str, norm: str) -> None:
    assert normalise_to(raw) == norm
