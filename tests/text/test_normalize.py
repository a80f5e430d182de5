"""The normalizer: a table of written → spoken pairs, plus properties every output must have."""

from __future__ import annotations

import random
import re

import pytest

from synth.text.normalize import normalize, normalize_once

# (written, spoken). Grouped roughly as the pipeline runs: money, numbers, times, dates, phone
# numbers and identifiers, units, abbreviations, acronyms, addresses, symbols, whole sentences.
CASES: list[tuple[str, str]] = [
    ("$1,234.56", "one thousand two hundred thirty four dollars and fifty six cents"),
    ("$1", "one dollar"),
    ("$5", "five dollars"),
    ("$0.99", "ninety nine cents"),
    ("$0.01", "one cent"),
    ("£1.05", "one pound and five pence"),
    ("£0.01", "one penny"),
    ("€20", "twenty euros"),
    ("€1.50", "one euro and fifty cents"),
    ("$5.00", "five dollars"),
    ("$1.01", "one dollar and one cent"),
    ("$10.5", "ten dollars and fifty cents"),
    ("$2.5 million", "two point five million dollars"),
    ("$3M", "three million dollars"),
    ("$5k", "five thousand dollars"),
    ("$5-10", "five to ten dollars"),
    ("$5.50-$10", "five dollars and fifty cents to ten dollars"),
    ("-$5", "minus five dollars"),
    ("20 USD", "twenty dollars"),
    ("EUR 15.25", "fifteen euros and twenty five cents"),
    ("$20/mo", "twenty dollars per month"),
    ("$0.015", "zero point zero one five dollars"),
    ("1,234,567", "one million two hundred thirty four thousand five hundred sixty seven"),
    ("-45", "minus forty five"),
    ("1000000000", "one billion"),
    ("7", "seven"),
    ("0", "zero"),
    ("1st", "first"),
    ("22nd", "twenty second"),
    ("103rd", "one hundred third"),
    ("11th", "eleventh"),
    ("3.14", "three point one four"),
    ("0.5", "zero point five"),
    (".5", "point five"),
    ("4.5%", "four point five percent"),
    ("-3%", "minus three percent"),
    ("3-5%", "three to five percent"),
    ("3-5", "three to five"),
    ("10-20 minutes", "ten to twenty minutes"),
    ("3:45 PM", "three forty five P M"),
    ("10:00 am", "ten Eh M"),
    ("14:30", "two thirty P M"),
    ("9 a.m.", "nine Eh M."),
    ("9am", "nine Eh M"),
    ("12:00", "twelve o'clock"),
    ("00:15", "twelve fifteen Eh M"),
    ("3:05 pm", "three oh five P M"),
    ("9-11am", "nine to eleven Eh M"),
    ("03/03/2024", "March third, twenty twenty four"),
    ("12/25/24", "December twenty fifth, twenty twenty four"),
    ("25/12/2024", "December twenty fifth, twenty twenty four"),
    ("2026-03-05", "March fifth, twenty twenty six"),
    ("March 3rd", "March third"),
    ("Mar 3", "March third"),
    ("Sept 21, 2025", "September twenty first, twenty twenty five"),
    ("March 2024", "March twenty twenty four"),
    ("5 May", "the fifth of May"),
    ("the 3rd of March", "the third of March"),
    ("in 1999", "in nineteen ninety nine"),
    ("since 2005", "since two thousand five"),
    ("in 2024", "in twenty twenty four"),
    ("the 1990s", "the nineteen nineties"),
    ("the '80s", "the eighties"),
    ("(555) 123-4567", "five five five, one two three, four five six seven"),
    ("+1 555 123 4567", "plus one, five five five, one two three, four five six seven"),
    ("555-123-4567", "five five five, one two three, four five six seven"),
    ("1-800-555-0199", "one, eight hundred, five five five, zero one nine nine"),
    ("555.123.4567", "five five five, one two three, four five six seven"),
    ("555-1234", "five five five, one two three four"),
    (
        "call 555-123-4567 ext. 22",
        "call five five five, one two three, four five six seven, extension two two",
    ),
    ("account 12345678", "account one two three four five six seven eight"),
    ("account number is 00123", "account number is zero zero one two three"),
    ("PIN 1234", "P I N one two three four"),
    ("your PIN is 0420", "your P I N is zero four two zero"),
    ("code 9", "code nine"),
    ("reference: 7734", "reference: seven seven three four"),
    ("confirmation number 88121", "confirmation number eight eight one two one"),
    ("card ending in 0042", "card ending in zero zero four two"),
    ("order #12345", "order number one two three four five"),
    ("room 101", "room one zero one"),
    ("007", "zero zero seven"),
    ("12345", "one two three four five"),
    ("10000", "ten thousand"),
    ("2024", "two thousand twenty four"),
    ("5 mg/L", "five milligrams per liter"),
    ("10 km", "ten kilometers"),
    ("1 kg", "one kilogram"),
    ("2.5 lb", "two point five pounds"),
    ("60 mph", "sixty miles per hour"),
    ("72°F", "seventy two degrees Fahrenheit"),
    ("-5°C", "minus five degrees Celsius"),
    ("98.6 °F", "ninety eight point six degrees Fahrenheit"),
    ("16 GB", "sixteen gigabytes"),
    ("500 MB", "five hundred megabytes"),
    ("200 ms", "two hundred milliseconds"),
    ("5 cm", "five centimeters"),
    ("3 mm", "three millimeters"),
    ("250 ml", "two hundred fifty milliliters"),
    ("1 hr", "one hour"),
    ("5 min", "five minutes"),
    ("Dr. Smith", "Doctor Smith"),
    ("12 Main Dr.", "twelve Main Drive."),
    ("St. Louis", "Saint Louis"),
    ("Elm St.", "Elm Street."),
    ("Mr. Jones", "Mister Jones"),
    ("Mrs. Jones", "Missus Jones"),
    ("Ms. Lee", "Miz Lee"),
    ("Acme Inc.", "Acme Incorporated."),
    ("Acme Inc. is hiring", "Acme Incorporated is hiring"),
    ("Foo Ltd.", "Foo Limited."),
    ("Bar Co. makes tea", "Bar Company makes tea"),
    ("Baz Corp.", "Baz Corporation."),
    ("John Smith Jr.", "John Smith Junior."),
    ("5th Ave.", "fifth Avenue."),
    ("Sunset Blvd.", "Sunset Boulevard."),
    ("Apt. 4B", "Apartment four B"),
    ("No. 5", "number five"),
    ("cats vs. dogs", "cats versus dogs"),
    ("apples, etc.", "apples, et cetera."),
    ("fruit, e.g. apples", "fruit, for example, apples"),
    ("fruit, e.g., apples", "fruit, for example, apples"),
    ("one, i.e. the first", "one, that is, the first"),
    ("APR", "Eh P R"),
    ("ATM", "Eh T M"),
    ("ATMs", "Eh T M's"),
    ("PIN", "P I N"),
    ("ID", "I D"),
    ("IDs", "I D's"),
    ("SSN", "S S N"),
    ("IRS", "I R S"),
    ("FAQ", "F Eh Q"),
    ("USA", "U S Eh"),
    ("NASA", "NASA"),
    ("U.S.", "U S."),
    ("OK", "okay"),
    ("john.doe@example.com", "john dot doe at example dot com"),
    ("support+billing@my-shop.co.uk", "support plus billing at my dash shop dot co dot uk"),
    ("https://www.example.com/help", "w w w dot example dot com slash help"),
    ("www.example.com", "w w w dot example dot com"),
    ("example.com/pay", "example dot com slash pay"),
    ("Tom & Jerry", "Tom and Jerry"),
    ("#5", "number five"),
    ("x2", "times two"),
    ("2x", "two times"),
    ("press #", "press pound"),
    ("press *", "press star"),
    ("and/or", "and or"),
    ("24/7", "twenty four seven"),
    ("w/ cheese", "with cheese"),
    ("N/A", "not applicable"),
    ("Mon-Fri", "Monday to Friday"),
    ("Mon., Mar 3", "Monday, March third"),
    ("1/2", "one half"),
    ("3/4 cup", "three quarters cup"),
    ("3/15", "March fifteenth"),
    ("version 1.2.3", "version one dot two dot three"),
    ("~5", "about five"),
    ("+5", "plus five"),
    ("AB12C", "Eh B one two C"),
    ("user42", "user four two"),
    ("4G", "four G"),
    ("Q3", "Q three"),
    ("**bold** text", "bold text"),
    ("- bullet point", "bullet point"),
    ("wait - what", "wait — what"),
    ("a (b) c", "a, b, c"),
    ("Hello there, how are you?", "Hello there, how are you?"),
    ("I'm fine. Thanks!", "I'm fine. Thanks!"),
    ("Rates: 3.25% APR.", "Rates: three point two five percent Eh P R."),
    ("On 2024-03-05T10:30 we met.", "On March fifth, twenty twenty four at ten thirty we met."),
    (
        "On 2024-03-05T14:30:00Z we met.",
        "On March fifth, twenty twenty four at two thirty P M we met.",
    ),
    (
        "It weighs 5kg and costs $5/kg.",
        "It weighs five kilograms and costs five dollars per kilogram.",
    ),
    ("Dial *67 then 1.", "Dial star six seven then one."),
    ("3 x 4 = 12", "three times four equals twelve"),
    ("a 10x20 room", "a ten times twenty room"),
    ("yes/no and and/or", "yes or no and and or"),
    (
        "Your balance is $1,234.56.",
        "Your balance is one thousand two hundred thirty four dollars and fifty six cents.",
    ),
    (
        "Call at 3:45 PM or 10:00 am or 14:30 or 9 a.m. Thanks.",
        "Call at three forty five P M or ten Eh M or two thirty P M or nine Eh M. Thanks.",
    ),
    ("Open 9am-5pm, Mon.-Fri.", "Open nine Eh M to five P M, Monday to Friday."),
    (
        "On 3 March 2024 and the 5th of May.",
        "On the third of March, twenty twenty four and the fifth of May.",
    ),
    (
        "Dr. Smith lives at 12 Main Dr. in St. Louis on Elm St.",
        "Doctor Smith lives at twelve Main Drive in Saint Louis on Elm Street.",
    ),
    (
        "Visit St. Louis today. I work at Acme Inc.",
        "Visit Saint Louis today. I work at Acme Incorporated.",
    ),
    ("We're on Main St. Then turn left.", "We're on Main Street. Then turn left."),
    ("The U.S. economy and ATMs and IDs.", "The U S economy and Eh T M's and I D's."),
    (
        "In 1999 and in 2024, since 2005, the 1990s and the '90s, 2019-2024.",
        "In nineteen ninety nine and in twenty twenty four, since two thousand five, the "
        "nineteen nineties and the nineties, twenty nineteen to twenty twenty four.",
    ),
    (
        "It's 10000 steps, 12000 miles, ID 4455, room 101.",
        "It's ten thousand steps, twelve thousand miles, I D four four five five, room one "
        "zero one.",
    ),
    (
        "Call +44 20 7946 0958 ext. 12.",
        "Call plus four four, two zero, seven nine four six, zero nine five eight, extension "
        "one two.",
    ),
    (
        "SSN 123-45-6789, card 4111 1111 1111 1111.",
        "S S N one two three, four five, six seven eight nine, card four one one one, one one "
        "one one, one one one one, one one one one.",
    ),
    (
        "Version 1.2.3 at 192.168.0.1.",
        "Version one dot two dot three at one hundred ninety two dot one hundred sixty eight "
        "dot zero dot one.",
    ),
    ("Call 911 now", "Call nine one one now"),
    ("(800) 555-1234", "eight hundred, five five five, one two three four"),
    ("in 1500 ms", "in one thousand five hundred milliseconds"),
    ("The IT team and the US office.", "The I T team and the U S office."),
    ("PLEASE CALL US ABOUT IT TODAY.", "PLEASE CALL US ABOUT IT TODAY."),
    ("March 3 at 3:45 pm.", "March third at three forty five P M."),
    ("$1.5 billion", "one point five billion dollars"),
    ("I was born in May 1990.", "I was born in May nineteen ninety."),
    ("Your code is ABC123.", "Your code is Eh B C one two three."),
    ("1-800-FLOWERS", "one, eight hundred, FLOWERS"),
    ("COVID-19 rules", "COVID nineteen rules"),
    ("I-95 north", "I ninety five north"),
    ("the 80/20 rule", "the eighty twenty rule"),
    ("AT&T", "Eh T and T"),
    ("12:30:45", "twelve thirty and forty five seconds"),
    ("Score was 3:1.", "Score was three to one."),
    ("1.5x faster", "one point five times faster"),
    ("Dial *67 first.", "Dial star six seven first."),
]

# Text a phone agent says that needs no rewriting at all.
PLAIN: list[str] = [
    "Hello, how can I help you today?",
    "I'm sorry, I didn't catch that. Could you repeat it?",
    "A customer called about an issue with her bill.",
    "Sure! Let me check that for you.",
    "May I have your name, please?",
    "We're open Monday through Friday; on weekends we're closed.",
    "The doctor will see you now — please hold.",
    "Thank you for calling. Goodbye!",
    'Please say "yes" or "no".',
    "It's a well-known problem, and we're working on it.",
    "Press one for sales, or stay on the line.",
    "Let us know if you need anything else.",
    '"Great," she said.',
    "Wait... what?",
]

# Anything espeak would read by name or skip; sentence punctuation and the em dash stay.
_ODD_SYMBOLS = re.compile(r"[\d$€£¥%&@#/*+=<>^~_|\\`{}\[\]°()]")


def test_table_is_large() -> None:
    assert len(CASES) >= 80
    assert len({written for written, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("written", "spoken"), CASES, ids=[w for w, _ in CASES])
def test_reads(written: str, spoken: str) -> None:
    assert normalize(written) == spoken


@pytest.mark.parametrize("text", PLAIN)
def test_plain_text_unchanged(text: str) -> None:
    assert normalize(text) == text


def test_outputs_have_no_digits_or_odd_symbols() -> None:
    for written, _ in CASES:
        spoken = normalize(written)
        assert not _ODD_SYMBOLS.search(spoken), (written, spoken)


def test_one_pass_is_already_a_fixed_point_for_real_text() -> None:
    # Ordinary text settles in one pass; normalize's extra passes are only a safety net for
    # glued-together input.
    for written, _ in CASES:
        once = normalize_once(written)
        assert normalize_once(once) == once, written


_FUZZ_TOKENS = [
    "1", "23", "007", "1,234", "3.5", ".5", "$", "€", "£", "%", "-", "–", "/", ":", ".", ",",
    "?", "!", "(", ")", "#", "*", "&", "@", "+", "=", "x", "°", "F", "mg", "km", "GB", "a.m.",
    "PM", "Dr.", "St.", "Mr.", "Inc.", "No.", "e.g.", "APR", "PIN", "A", "the", "Main", "Smith",
    "account", "code", "in", "March", "Mar", "1st", "'", '"', "\n", "2024", "1999", "555",
    "123-4567", "12345678", "0", "12", "30", "www", "example.com", "j@x.io", "...",
]  # fmt: skip


def test_fuzz_fixed_point_and_no_digits() -> None:
    rng = random.Random(20240303)
    for _ in range(1500):
        text = "".join(
            rng.choice(_FUZZ_TOKENS) + ("" if rng.random() < 0.3 else " ")
            for _ in range(rng.randint(1, 10))
        )
        spoken = normalize(text)
        assert normalize(spoken) == spoken, text
        assert not re.search(r"\d", spoken), (text, spoken)


def test_money_singular_and_plural() -> None:
    assert normalize("$1.01") == "one dollar and one cent"
    assert normalize("$2.02") == "two dollars and two cents"
    assert normalize("£1.01") == "one pound and one penny"


def test_dr_and_st_depend_on_context() -> None:
    assert normalize("Ask Dr. Lee about 4 Oak Dr. today.") == (
        "Ask Doctor Lee about four Oak Drive today."
    )
    assert normalize("Meet me at St. Mary's on Elm St. at 9.") == (
        "Meet me at Saint Mary's on Elm Street at nine."
    )


def test_abbreviation_keeps_the_sentence_period() -> None:
    assert normalize("We work with Acme Inc. They are great.") == (
        "We work with Acme Incorporated. They are great."
    )
    assert normalize("Acme Inc. is great.") == "Acme Incorporated is great."


def test_newlines_are_kept_for_the_chunker() -> None:
    assert normalize("Line 1\nLine 2") == "Line one\nLine two"
