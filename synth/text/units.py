"""Units of measure read after a number: symbol → (singular, plural).

Matching is case-sensitive because case carries meaning (``mb`` millibar vs ``MB`` megabyte,
``ms`` vs ``Ms.``). Symbols that are also common words or other abbreviations (``in``, ``m`` for
million in money talk, bare ``s``/``h``) are deliberately absent: a wrong expansion is worse than
espeak's reading of the symbol.
"""

from __future__ import annotations

UNITS: dict[str, tuple[str, str]] = {
    # mass
    "mg": ("milligram", "milligrams"),
    "mcg": ("microgram", "micrograms"),
    "µg": ("microgram", "micrograms"),
    "g": ("gram", "grams"),
    "kg": ("kilogram", "kilograms"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    # length
    "mm": ("millimeter", "millimeters"),
    "cm": ("centimeter", "centimeters"),
    "km": ("kilometer", "kilometers"),
    "ft": ("foot", "feet"),
    "mi": ("mile", "miles"),
    "yd": ("yard", "yards"),
    # volume
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "L": ("liter", "liters"),
    "dL": ("deciliter", "deciliters"),
    "gal": ("gallon", "gallons"),
    # speed
    "mph": ("mile per hour", "miles per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    # time
    "ms": ("millisecond", "milliseconds"),
    "sec": ("second", "seconds"),
    "secs": ("second", "seconds"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    # data
    "KB": ("kilobyte", "kilobytes"),
    "kB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "kbps": ("kilobit per second", "kilobits per second"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    # electrical, frequency, level
    "Hz": ("hertz", "hertz"),
    "kHz": ("kilohertz", "kilohertz"),
    "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "V": ("volt", "volts"),
    "W": ("watt", "watts"),
    "kW": ("kilowatt", "kilowatts"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "mAh": ("milliamp hour", "milliamp hours"),
    "dB": ("decibel", "decibels"),
}

# Denominators after "/" ("5 mg/L", "$20/mo"): always singular, read "per ...".
PER_UNITS: dict[str, str] = {
    **{symbol: names[0] for symbol, names in UNITS.items()},
    "h": "hour",
    "s": "second",
    "m": "meter",
    "l": "liter",
    "mo": "month",
    "month": "month",
    "yr": "year",
    "year": "year",
    "wk": "week",
    "week": "week",
    "day": "day",
    "night": "night",
    "hour": "hour",
    "minute": "minute",
    "person": "person",
    "user": "user",
    "line": "line",
    "unit": "unit",
    "dose": "dose",
}

# Temperature scales after a degree sign.
TEMPERATURE_SCALES: dict[str, str] = {"F": "Fahrenheit", "C": "Celsius", "K": "Kelvin"}
