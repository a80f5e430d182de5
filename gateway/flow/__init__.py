"""Call flows (the ``flow`` agent): verbs such as say, gather, transfer and record, as jambonz
and TwiML write them (``verbs``: the verbs and the schema they are checked against), from a file
read at start or a webhook asked during the call (``source``), run by a small interpreter on the
call (``engine``), which transfers and records through the call's own methods (``actions``).
docs/flows.md is the reference."""
