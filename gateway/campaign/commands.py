"""``voxgate campaign``: run an outbound campaign from a CSV through a gateway's REST API.

``voxgate campaign run contacts.csv [--cps N] [--concurrency N] [--agent JSON | --agent-kind K]
[--amd] [--voicemail TEXT] [--retries JSON] [--window SPEC]`` checks the CSV here first (every
bad row printed with its line number, exit 2, nothing created), ``POST``s the campaign, then
polls it, drawing a progress bar on stderr, and prints a summary at the end: contacts per
outcome, and per contact its number, outcome and attempts. Ctrl-C cancels the campaign
(``DELETE``: no new calls, live ones finish) and prints the summary so far (exit 130).

``voxgate campaign status|pause|resume|cancel ID`` and ``voxgate campaign list`` do what they
say. ``--url`` (default ``$VOXGATE_URL`` or http://127.0.0.1:8080) and ``--token`` (default
``$VOXGATE_GATEWAY_API_TOKEN``) name the gateway. Exit status: 0 done, 1 the gateway refused
or could not be reached, 2 bad input, 130 interrupted.

Plain ``urllib`` (no event loop): a CLI that waits on one gateway needs nothing more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

DEFAULT_URL = "http://127.0.0.1:8080"
BAR_WIDTH = 30
# Final states: the campaign dials no more (its live calls may still be finishing).
OVER = ("done", "cancelled")


class ApiError(Exception):
    """The gateway answered an error (``status`` > 0) or could not be reached (0)."""

    def __init__(self, status: int, body: Mapping[str, Any], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.message = message


class Client:
    """The campaign routes of one gateway, over HTTP with the bearer token."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: object | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                answer: dict[str, Any] = json.loads(resp.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {}
            if not isinstance(err, dict):
                err = {}
            error = err.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            raise ApiError(exc.code, err, message or f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(0, {}, f"cannot reach {self.url}: {reason}") from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("campaign", help="outbound campaigns through a gateway's API")
    csub = p.add_subparsers(dest="campaign_command", metavar="ACTION")
    csub.required = True

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--url", default=os.environ.get("VOXGATE_URL", DEFAULT_URL), help="the gateway's API"
        )
        q.add_argument(
            "--token",
            default=os.environ.get("VOXGATE_GATEWAY_API_TOKEN") or None,
            help="API bearer token (default $VOXGATE_GATEWAY_API_TOKEN)",
        )

    run = csub.add_parser("run", help="create a campaign from a CSV and follow it to the end")
    run.add_argument("csv", metavar="contacts.csv", help="header row with a 'to' column")
    common(run)
    agent = run.add_mutually_exclusive_group()
    agent.add_argument("--agent", metavar="JSON", help='the agent, e.g. {"kind": "ivr"}')
    agent.add_argument(
        "--agent-kind", metavar="KIND", help="the agent's kind alone (ivr, flow, llm, stream)"
    )
    run.add_argument("--cps", type=float, help="calls per second (default 1)")
    run.add_argument("--concurrency", type=int, help="calls up at once (default 10)")
    run.add_argument("--amd", action="store_true", help="answering-machine detection")
    run.add_argument("--voicemail", metavar="TEXT", help="left after the beep (needs --amd)")
    run.add_argument(
        "--retries", metavar="JSON", help='e.g. {"busy": {"max": 2, "backoff_s": 300}}'
    )
    run.add_argument(
        "--window",
        metavar="SPEC",
        help="calling window: 'HH:MM-HH:MM [DAYS] [TZ]' (e.g. '09:00-20:00 mon-fri "
        "Europe/Paris') or a JSON object",
    )
    run.add_argument("--ring-timeout", type=float, metavar="S", help="seconds to ring")
    run.add_argument("--id", help="the campaign's id (default: the gateway picks one)")
    run.add_argument("--poll", type=float, default=1.0, metavar="S", help="poll interval")
    run.add_argument(
        "--no-wait", action="store_true", help="create the campaign and print its id only"
    )
    run.set_defaults(func=cmd_run)

    for name, helptext in (
        ("status", "a campaign's state, totals and contacts"),
        ("pause", "stop dialling (live calls go on)"),
        ("resume", "dial again"),
        ("cancel", "no new calls; live ones finish"),
    ):
        q = csub.add_parser(name, help=helptext)
        q.add_argument("id")
        common(q)
        q.add_argument("--json", action="store_true", help="print the campaign as JSON")
        q.set_defaults(func=cmd_control, action=name)
    q = csub.add_parser("list", help="every campaign with its totals")
    common(q)
    q.add_argument("--json", action="store_true", help="print the list as JSON")
    q.set_defaults(func=cmd_list)


# --- building the request --------------------------------------------------------------------


class InputError(ValueError):
    pass


def window_from_text(text: str) -> dict[str, Any]:
    """``HH:MM-HH:MM [DAYS] [TZ]`` or a JSON object, as the spec's ``window``."""
    text = text.strip()
    if text.startswith("{"):
        value = _json_arg("--window", text)
        if not isinstance(value, dict):
            raise InputError("--window: a JSON object, or 'HH:MM-HH:MM [DAYS] [TZ]'")
        return value
    parts = text.split()
    start, dash, end = parts[0].partition("-") if parts else ("", "", "")
    if not dash or len(parts) > 3:
        raise InputError(f"--window: expected 'HH:MM-HH:MM [DAYS] [TZ]', got {text!r}")
    window: dict[str, Any] = {"start": start, "end": end}
    for part in parts[1:]:
        # Time zones have a '/' or are UTC-like names; day lists are lower-case day names.
        if "/" in part or part.upper() == part:
            window["tz"] = part
        else:
            window["days"] = part
    return window


def _json_arg(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputError(f"{flag}: not JSON: {exc}") from None


def build_body(args: argparse.Namespace, contacts: Sequence[Any]) -> dict[str, Any]:
    """The ``POST /api/campaigns`` body from the flags and the parsed contacts."""
    if args.agent is not None:
        agent = _json_arg("--agent", args.agent)
        if not isinstance(agent, dict):
            raise InputError("--agent: must be a JSON object")
    else:
        agent = {"kind": args.agent_kind or "ivr"}
    body: dict[str, Any] = {"agent": agent, "amd": bool(args.amd)}
    if args.cps is not None:
        body["cps"] = args.cps
    if args.concurrency is not None:
        body["max_concurrent"] = args.concurrency
    if args.voicemail is not None:
        body["voicemail"] = args.voicemail
    if args.retries is not None:
        body["retries"] = _json_arg("--retries", args.retries)
    if args.window is not None:
        body["window"] = window_from_text(args.window)
    if args.ring_timeout is not None:
        body["ring_timeout_s"] = args.ring_timeout
    if args.id is not None:
        body["id"] = args.id
    body["contacts"] = [{"to": c.to, "vars": dict(c.vars)} for c in contacts]
    return body


# --- commands --------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from gateway.campaign.contacts import ContactsError, parse_contacts_csv
    from gateway.campaign.spec import SpecError, parse_spec

    try:
        with open(args.csv, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        print(f"voxgate campaign: {args.csv}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        contacts = parse_contacts_csv(data)
    except ContactsError as exc:
        for e in exc.errors:
            where = f"line {e.row}" if e.row is not None else "file"
            print(f"{args.csv}: {where}: {e.reason}", file=sys.stderr)
        print(f"voxgate campaign: {len(exc.errors)} bad row(s); nothing created", file=sys.stderr)
        return 2
    try:
        body = build_body(args, contacts)
        parse_spec({k: v for k, v in body.items() if k not in ("contacts", "id")})
    except InputError as exc:
        print(f"voxgate campaign: {exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"voxgate campaign: bad campaign: {exc}", file=sys.stderr)
        return 2
    client = Client(args.url, args.token)
    try:
        created = client.request("POST", "/api/campaigns", body)
    except ApiError as exc:
        return _refused(exc)
    cid = created["id"]
    header = f"campaign {cid}: {len(contacts)} contacts"
    if args.no_wait:
        print(header, file=sys.stderr)
        print(cid)
        return 0
    return follow(client, cid, args.poll, sys.stderr, sys.stdout, header=header)


def follow(
    client: Client, cid: str, poll_s: float, err: TextIO, out: TextIO, *, header: str = ""
) -> int:
    """Poll until the campaign is over, with a progress bar; Ctrl-C cancels it."""
    bar = Progress(err)
    interrupted = False
    # SIGTERM too (a CI job stopped): the same as Ctrl-C. SIGINT is set explicitly: a process
    # started in the background by a shell inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt for it. (Only the main thread may set a handler; called from
    # another one, e.g. embedded, Ctrl-C is the caller's business.)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt) if main else None
    try:
        first = True
        while True:
            try:
                if first:
                    # Inside the Ctrl-C handling: whoever saw this line may interrupt at once.
                    first = False
                    if header:
                        print(header, file=err, flush=True)
                # Totals only while it runs (a large campaign's contacts are many); the whole
                # campaign once for the summary.
                campaign = client.request("GET", f"/api/campaigns/{cid}?limit=0")
                bar.show(campaign)
                totals = campaign["totals"]
                if campaign["state"] in OVER and totals["in_flight"] == 0:
                    campaign = client.request("GET", f"/api/campaigns/{cid}")
                    break
                time.sleep(poll_s)
            except KeyboardInterrupt:
                interrupted = True
                bar.end()
                print(f"interrupted: cancelling campaign {cid}", file=err)
                try:
                    campaign = client.request("DELETE", f"/api/campaigns/{cid}")
                    campaign = client.request("GET", f"/api/campaigns/{cid}")
                except ApiError as exc:
                    print(f"voxgate campaign: cancel failed: {exc.message}", file=err)
                    return 1
                break
    except ApiError as exc:
        bar.end()
        print(f"voxgate campaign: {exc.message}", file=err)
        return 1
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
    bar.end()
    print_summary(campaign, out)
    return 130 if interrupted else 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_control(args: argparse.Namespace) -> int:
    client = Client(args.url, args.token)
    path = f"/api/campaigns/{args.id}"
    method, suffix = {
        "status": ("GET", ""),
        "pause": ("POST", "/pause"),
        "resume": ("POST", "/resume"),
        "cancel": ("DELETE", ""),
    }[args.action]
    try:
        campaign = client.request(method, path + suffix)
        if args.action != "status":
            campaign = client.request("GET", path)
    except ApiError as exc:
        return _refused(exc)
    if args.json:
        print(json.dumps(campaign, indent=2))
    else:
        print_summary(campaign, sys.stdout)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        campaigns = Client(args.url, args.token).request("GET", "/api/campaigns")["campaigns"]
    except ApiError as exc:
        return _refused(exc)
    if args.json:
        print(json.dumps(campaigns, indent=2))
        return 0
    print(f"{'id':<20} {'state':<10} {'done':>11}  outcomes")
    for c in campaigns:
        t = c["totals"]
        done = sum(t["outcomes"].values())
        print(f"{c['id']:<20} {c['state']:<10} {done:>5}/{t['contacts']:<5}  {_counts(t)}")
    return 0


def _refused(exc: ApiError) -> int:
    """Print the gateway's refusal (the bad field or rows); 2 for bad input, else 1."""
    print(f"voxgate campaign: {exc.message}", file=sys.stderr)
    if "field" in exc.body:
        print(f"  field: {exc.body['field']}", file=sys.stderr)
    for row in exc.body.get("rows", []):
        where = "contacts" if row.get("row") is None else f"contact #{row['row']}"
        print(f"  {where}: {row.get('reason')}", file=sys.stderr)
    return 2 if exc.status in (400, 413) else 1


# --- output ----------------------------------------------------------------------------------


def _counts(totals: Mapping[str, Any]) -> str:
    outcomes: Mapping[str, int] = totals.get("outcomes", {})
    return " ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "-"


class Progress:
    """A one-line bar on a terminal; on anything else, a line each time the numbers move."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""

    def show(self, campaign: Mapping[str, Any]) -> None:
        t = campaign["totals"]
        total = max(int(t["contacts"]), 1)
        done = sum(t["outcomes"].values())
        filled = BAR_WIDTH * done // total
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        line = (
            f"[{bar}] {done}/{t['contacts']} {campaign['state']}, "
            f"{t['in_flight']} in flight | {_counts(t)}"
        )
        if line == self.last:
            return
        self.last = line
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()
        self.last = ""


def print_summary(campaign: Mapping[str, Any], out: TextIO) -> None:
    """Per outcome counts, then per contact: to, outcome, attempts."""
    t = campaign["totals"]
    print(f"campaign {campaign['id']}: {campaign['state']}", file=out)
    print(f"{'outcome':<16} {'contacts':>8}", file=out)
    for outcome, n in sorted(t["outcomes"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{outcome:<16} {n:>8}", file=out)
    for label, key in (("(pending)", "pending"), ("(in flight)", "in_flight")):
        if t.get(key):
            print(f"{label:<16} {t[key]:>8}", file=out)
    print(f"{'total':<16} {t['contacts']:>8}   ({t['attempts']} attempts)", file=out)
    contacts = campaign.get("contacts")
    if not contacts:
        return
    width = max(len("to"), *(len(c["to"]) for c in contacts))
    print("", file=out)
    print(f"{'to':<{width}}  {'outcome':<16} attempts", file=out)
    for c in contacts:
        outcome = c["outcome"] or ("in flight" if c.get("claimed_by") else "pending")
        attempts = c["attempts"]
        detail = ", ".join(_attempt_text(a) for a in attempts)
        print(f"{c['to']:<{width}}  {outcome:<16} {len(attempts)}  {detail}".rstrip(), file=out)


def _attempt_text(a: Mapping[str, Any]) -> str:
    text = str(a.get("outcome") or "live")
    if a.get("sip_status") and a.get("outcome") not in ("human", "machine"):
        text += f" {a['sip_status']}"
    if a.get("reason"):
        text += f" ({a['reason']})"
    if a.get("voicemail_left"):
        text += " +voicemail"
    return text
