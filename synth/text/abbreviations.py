"""Written abbreviations and what they are read as.

Three kinds, because they behave differently around a name and at a sentence end:

* ``TITLES`` come before a name ("Dr. Smith"); their period never ends a sentence.
* ``PLACES`` come after a name or house number ("12 Main St."); a title and a place may share
  a spelling (Dr. = Doctor / Drive, St. = Saint / Street) and context decides.
* ``PLAIN`` are read the same anywhere; when their period is also the sentence's, it is kept.
"""

from __future__ import annotations

TITLES: dict[str, str] = {
    "Mr": "Mister",
    "Mrs": "Missus",
    "Ms": "Miz",
    "Dr": "Doctor",
    "Prof": "Professor",
    "St": "Saint",
    "Mt": "Mount",
    "Ft": "Fort",
    "Rev": "Reverend",
    "Capt": "Captain",
    "Sgt": "Sergeant",
    "Gov": "Governor",
    "Sen": "Senator",
    "Rep": "Representative",
}

PLACES: dict[str, str] = {
    "Dr": "Drive",
    "St": "Street",
    "Ave": "Avenue",
    "Blvd": "Boulevard",
    "Rd": "Road",
    "Ln": "Lane",
    "Ct": "Court",
    "Pl": "Place",
    "Sq": "Square",
    "Hwy": "Highway",
    "Pkwy": "Parkway",
    "Cir": "Circle",
    "Ter": "Terrace",
    "Mt": "Mount",
    "Ft": "Fort",
}

# Read the same wherever they stand; matched with their period (or as shown).
PLAIN: dict[str, str] = {
    "Inc.": "Incorporated",
    "Ltd.": "Limited",
    "Co.": "Company",
    "Corp.": "Corporation",
    "Bros.": "Brothers",
    "Jr.": "Junior",
    "Sr.": "Senior",
    "Apt.": "Apartment",
    "Ste.": "Suite",
    "Dept.": "Department",
    "dept.": "department",
    "Univ.": "University",
    "vs.": "versus",
    "vs": "versus",
    "etc.": "et cetera",
    "approx.": "approximately",
    "Approx.": "Approximately",
    "appt.": "appointment",
    "Appt.": "Appointment",
    "ext.": "extension",
    "Ext.": "Extension",
    "tel.": "telephone",
    "Tel.": "Telephone",
    "est.": "estimated",
    "a.k.a.": "also known as",
    "aka": "also known as",
    "and/or": "and or",
    "AT&T": "Eh T and T",
    "w/o": "without",
    "w/": "with",
    "N/A": "not applicable",
    "n/a": "not applicable",
    "24/7": "twenty four seven",
}

# Latin abbreviations that introduce an example or restatement: read with a comma after, as a
# speaker pauses there ("e.g., Visa" and "e.g. Visa" both become "for example, Visa").
INTRODUCERS: dict[str, str] = {
    "e.g.": "for example",
    "i.e.": "that is",
    "cf.": "compare",
    "viz.": "namely",
}

# "No. 5", "Nos. 3 and 4": only before a number, where it cannot be the word "no".
NUMBER_SIGNS: tuple[str, ...] = ("No.", "no.", "Nos.", "nos.", "#")
