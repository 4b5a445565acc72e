"""The fixed search corpus: 1,000 tool descriptors and 200 queries written from their descriptions.

    python -m bench.search_corpus            # writes bench/search-corpus/{tools,queries}.json
    python -m bench.search_corpus --check    # exits 1 if the committed files differ from what it makes

Made by this script alone, from fixed word lists and one seeded `random.Random`: no download, and the same
bytes on every machine and Python (3.11+: `Random.choice` and `shuffle` are stable across releases). The files
are committed, so a change to the ranker is measured on the same set as before; `--check` (run by the tests)
keeps the script and the files in step.

A tool is an action on an object of a product (`tracker.ticket.create`), described the way service authors
describe theirs: what it does, a sentence on when to use it, and its arguments, each with a description. Many
tools of different products share actions and objects (a ticket is created in three trackers), as in a real
fleet, so a query must name what tells them apart.

A query is written from one tool's description the way a user asks for it: some of its words, some replaced
by everyday synonyms (remove for delete, email for message), in a sentence of their own, sometimes naming the
product and sometimes only an argument's subject. Each query has exactly one right answer: the tool it was
written from. Recall@5 is the share of queries whose tool is among the first five results.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "search-corpus"
SEED = 20261203
TOOLS = 1000
QUERIES = 200

# product -> (what it is, its objects)
PRODUCTS: dict[str, tuple[str, list[str]]] = {
    "github": ("GitHub code hosting", ["repository", "issue", "pull-request", "branch", "release", "workflow"]),
    "gitlab": ("GitLab code hosting", ["project", "issue", "merge-request", "pipeline", "branch"]),
    "jira": ("Jira issue tracker", ["ticket", "sprint", "board", "comment", "epic"]),
    "linear": ("Linear issue tracker", ["ticket", "cycle", "project", "comment"]),
    "slack": ("Slack chat workspace", ["message", "channel", "user", "reaction", "file"]),
    "teams": ("Microsoft Teams chat", ["message", "channel", "meeting", "team"]),
    "gmail": ("Gmail mailbox", ["email", "draft", "label", "thread", "attachment"]),
    "outlook": ("Outlook mailbox and calendar", ["email", "event", "contact", "folder"]),
    "calendar": ("Google Calendar", ["event", "calendar", "invitation", "reminder"]),
    "drive": ("Google Drive storage", ["file", "folder", "permission", "comment"]),
    "dropbox": ("Dropbox file storage", ["file", "folder", "share-link"]),
    "s3": ("Amazon S3 object storage", ["bucket", "object", "policy", "lifecycle-rule"]),
    "postgres": ("PostgreSQL database", ["table", "query", "index", "backup", "role"]),
    "mongodb": ("MongoDB database", ["collection", "document", "index", "backup"]),
    "redis": ("Redis key-value cache", ["key", "stream", "snapshot"]),
    "kubernetes": ("Kubernetes cluster", ["pod", "deployment", "service", "namespace", "secret", "node"]),
    "docker": ("Docker engine", ["container", "image", "volume", "network"]),
    "terraform": ("Terraform infrastructure", ["plan", "workspace", "state", "module"]),
    "aws-ec2": ("Amazon EC2 compute", ["instance", "security-group", "volume", "snapshot"]),
    "stripe": ("Stripe payments", ["payment", "customer", "invoice", "refund", "subscription"]),
    "paypal": ("PayPal payments", ["payment", "payout", "dispute"]),
    "shopify": ("Shopify online store", ["product", "order", "customer", "discount", "inventory"]),
    "salesforce": ("Salesforce CRM", ["lead", "opportunity", "account", "contact", "report"]),
    "hubspot": ("HubSpot CRM", ["contact", "deal", "company", "email-campaign"]),
    "zendesk": ("Zendesk customer support", ["ticket", "macro", "customer", "satisfaction-rating"]),
    "intercom": ("Intercom customer messaging", ["conversation", "contact", "article"]),
    "notion": ("Notion workspace", ["page", "database", "block", "comment"]),
    "confluence": ("Confluence wiki", ["page", "space", "attachment", "comment"]),
    "sheets": ("Google Sheets spreadsheets", ["spreadsheet", "row", "cell-range", "chart"]),
    "excel": ("Microsoft Excel workbooks", ["workbook", "worksheet", "table", "formula"]),
    "twilio": ("Twilio messaging and voice", ["sms", "call", "phone-number", "recording"]),
    "sendgrid": ("SendGrid email delivery", ["email", "template", "contact-list", "bounce"]),
    "weather": ("a weather service", ["forecast", "alert", "observation", "air-quality"]),
    "maps": ("a maps service", ["route", "place", "geocode", "distance-matrix"]),
    "translate": ("a translation service", ["text", "document", "glossary"]),
    "pdf": ("PDF documents", ["document", "page", "form", "signature"]),
    "images": ("image processing", ["image", "thumbnail", "caption", "watermark"]),
    "audio": ("audio processing", ["transcript", "recording", "speech"]),
    "prometheus": ("Prometheus monitoring", ["metric", "alert-rule", "target", "silence"]),
    "grafana": ("Grafana dashboards", ["dashboard", "panel", "annotation", "alert"]),
    "pagerduty": ("PagerDuty incident response", ["incident", "schedule", "escalation-policy", "on-call"]),
    "sentry": ("Sentry error tracking", ["error", "release", "project", "alert"]),
    "datadog": ("Datadog observability", ["monitor", "dashboard", "log", "trace"]),
    "workday": ("Workday HR", ["employee", "time-off", "payslip", "position"]),
    "ledger": ("an accounting ledger", ["invoice", "expense", "journal-entry", "account", "budget"]),
    "quickbooks": ("QuickBooks accounting", ["invoice", "bill", "vendor", "payment"]),
    "dns": ("a DNS provider", ["record", "zone", "certificate"]),
    "cloudflare": ("Cloudflare edge network", ["zone", "firewall-rule", "cache", "worker"]),
    "spotify": ("Spotify music", ["playlist", "track", "album", "artist"]),
    "youtube": ("YouTube videos", ["video", "playlist", "comment", "channel"]),
    "flights": ("a flight booking service", ["flight", "booking", "seat", "fare"]),
    "hotels": ("a hotel booking service", ["hotel", "reservation", "room", "review"]),
    "news": ("a news service", ["article", "headline", "topic"]),
    "stocks": ("a market data service", ["quote", "chart", "watchlist", "company-profile"]),
    "wiki": ("Wikipedia", ["article", "summary", "revision"]),
    "search": ("a web search engine", ["web-result", "image-result", "news-result"]),
    "crm": ("an in-house CRM", ["customer", "note", "task", "pipeline"]),
    "hr": ("an in-house HR system", ["candidate", "interview", "offer", "onboarding"]),
    "warehouse": ("a warehouse system", ["shipment", "stock-level", "pick-list", "return"]),
    "iot": ("an IoT device fleet", ["device", "sensor-reading", "firmware", "command"]),
}

# action -> (verb in a description, what it says more, the synonyms a user may say instead)
ACTIONS: dict[str, tuple[str, str, list[str]]] = {
    "create": ("Create", "Use it to add a new one.", ["add", "make", "new", "open"]),
    "get": ("Get", "Returns every field of one by its id.", ["fetch", "show", "look up", "details of"]),
    "list": ("List", "Results are paged; filter by owner or date.", ["show all", "browse", "enumerate", "all my"]),
    "update": ("Update", "Only the fields given are changed.", ["change", "edit", "modify", "rename"]),
    "delete": ("Delete", "This cannot be undone.", ["remove", "erase", "get rid of", "drop"]),
    "search": ("Search", "Full-text search over titles and bodies.", ["find", "look for", "query", "which"]),
    "export": ("Export", "Writes a CSV or JSON file and returns its link.", ["download", "dump", "save a copy of"]),
    "archive": ("Archive", "It is kept read-only and can be restored.", ["put away", "retire", "hide"]),
    "share": ("Share", "Grants another person access by email.", ["give access to", "send", "invite someone to"]),
    "summarize": ("Summarize", "Returns a short summary in plain words.", ["sum up", "brief", "tl;dr of"]),
    "count": ("Count", "Returns how many there are, by status.", ["how many", "number of", "tally"]),
    "restore": ("Restore", "Brings back one that was deleted or archived.", ["undelete", "recover", "bring back"]),
}

# object word -> synonyms a user may say
SYNONYMS: dict[str, list[str]] = {
    "issue": ["bug", "ticket"],
    "ticket": ["issue", "case", "request"],
    "pull-request": ["PR", "code review"],
    "merge-request": ["MR", "code review"],
    "message": ["chat", "post", "note"],
    "email": ["mail", "message", "e-mail"],
    "event": ["meeting", "appointment"],
    "file": ["document", "upload"],
    "folder": ["directory"],
    "customer": ["client", "buyer"],
    "contact": ["person", "lead"],
    "invoice": ["bill"],
    "payment": ["charge", "transaction"],
    "refund": ["money back", "reimbursement"],
    "forecast": ["weather tomorrow", "outlook"],
    "route": ["directions", "way"],
    "text": ["sentence", "words"],
    "transcript": ["transcription", "text of a recording"],
    "employee": ["staff member", "worker"],
    "time-off": ["vacation", "leave", "holiday"],
    "incident": ["outage", "page"],
    "deployment": ["rollout", "app"],
    "pod": ["container"],
    "container": ["running app"],
    "record": ["DNS entry"],
    "playlist": ["mix"],
    "track": ["song"],
    "booking": ["reservation", "ticket"],
    "reservation": ["booking", "stay"],
    "article": ["story", "post"],
    "quote": ["price", "share price"],
    "shipment": ["parcel", "delivery"],
    "device": ["gadget", "thing"],
    "sms": ["text message"],
    "spreadsheet": ["sheet"],
    "row": ["line", "entry"],
    "page": ["doc", "note"],
    "repository": ["repo", "codebase"],
    "backup": ["dump", "copy"],
    "alert": ["alarm", "warning"],
    "error": ["exception", "crash"],
    "expense": ["spending", "cost"],
    "candidate": ["applicant"],
}

# object word -> arguments beyond the id: (name, type, description)
ARGUMENT_WORDS: dict[str, list[tuple[str, str, str]]] = {
    "create": [("title", "string", "Title or name of the new {object}"), ("body", "string", "Text of the {object}")],
    "get": [("id", "string", "Identifier of the {object}")],
    "list": [("owner", "string", "Only those owned by this user"), ("since", "string", "ISO date to list from")],
    "update": [("id", "string", "Identifier of the {object}"), ("fields", "object", "Fields to change and values")],
    "delete": [("id", "string", "Identifier of the {object} to delete")],
    "search": [("query", "string", "Words to look for"), ("limit", "integer", "Most results to return")],
    "export": [("format", "string", "csv or json"), ("since", "string", "ISO date to export from")],
    "archive": [("id", "string", "Identifier of the {object} to archive")],
    "share": [("id", "string", "Identifier of the {object}"), ("email", "string", "Email address to share with")],
    "summarize": [("id", "string", "Identifier of the {object}"), ("length", "integer", "Words in the summary")],
    "count": [("status", "string", "Only those with this status")],
    "restore": [("id", "string", "Identifier of the {object} to restore")],
}

CONTEXT = [
    "",
    "Needs a token with write scope.",
    "Times out after 30 seconds.",
    "Rate limited to 10 calls per second.",
    "Works on the account the service is configured for.",
]
QUERY_FORMS = [
    "{verb} {object} in {product}",
    "{verb} the {object} on {product}",
    "can you {verb} a {object} for me",
    "I need to {verb} {object} {product}",
    "{verb} {object}",
    "please {verb} my {product} {object}",
    "{product} {verb} {object} by {argument}",
    "how do I {verb} a {object} with {argument}",
]


def words(name: str) -> str:
    return name.replace("-", " ")


def make_tools(rng: random.Random) -> list[dict[str, Any]]:
    """Every (product, object, action) there is, in a fixed shuffled order, cut to `TOOLS`."""
    every = [(p, o, a) for p, (_, objects) in PRODUCTS.items() for o in objects for a in ACTIONS]
    rng.shuffle(every)
    chosen = sorted(every[:TOOLS])
    tools = []
    for product, obj, action in chosen:
        what, _ = PRODUCTS[product]
        verb, more, _ = ACTIONS[action]
        noun = words(obj)
        article = "an" if noun[0] in "aeiou" else "a"
        description = f"{verb} {article if action != 'list' else 'the'} {noun}{'s' if action == 'list' else ''}"
        description += f" in {what}. {more} {rng.choice(CONTEXT)}".rstrip()
        arguments = [
            {"name": name, "type": kind, "description": text.format(object=noun)}
            for name, kind, text in ARGUMENT_WORDS[action]
        ]
        tools.append(
            {
                "type": "tool-service",
                "name": f"{product}.{obj}.{action}",
                "title": f"{verb} {noun} ({product})",
                "description": description,
                "service": f"{product}-service",
                "arguments": arguments,
            }
        )
    return tools


def make_query(rng: random.Random, tool: dict[str, Any]) -> str:
    product, obj, action = tool["name"].split(".")
    _, _, verbs = ACTIONS[action]
    verb = rng.choice([action, *verbs]) if rng.random() < 0.7 else action
    noun = rng.choice(SYNONYMS.get(obj, [words(obj)])) if rng.random() < 0.4 else words(obj)
    argument = rng.choice(tool["arguments"])["description"].lower()
    form = rng.choice(QUERY_FORMS)
    if rng.random() < 0.25:  # the product left unsaid, or said as what it is
        form = form.replace("{product}", "").replace(" in ", " ").replace(" on ", " ")
    elif rng.random() < 0.3:
        product = PRODUCTS[product][0]
    text = form.format(verb=verb, object=noun, product=words(product), argument=argument)
    return " ".join(text.split())


def make() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(SEED)
    tools = make_tools(rng)
    targets = rng.sample(range(len(tools)), QUERIES)
    queries = [{"query": make_query(rng, tools[i]), "tool": tools[i]["name"]} for i in targets]
    return tools, queries


def dump(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search_corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files differ from what it makes")
    args = parser.parse_args(argv)
    tools, queries = make()
    files = {HERE / "tools.json": dump(tools), HERE / "queries.json": dump(queries)}
    if args.check:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"search corpus out of date: {', '.join(stale)}; run python -m bench.search_corpus", file=sys.stderr)
            return 1
        return 0
    HERE.mkdir(exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    print(f"wrote {len(tools)} tools and {len(queries)} queries to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
