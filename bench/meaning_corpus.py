"""The meaning corpus: tools an assistant's fleet offers, and queries that say what is wanted in other words.

    python -m bench.meaning_corpus            # writes bench/meaning-corpus/{tools,queries}.json
    python -m bench.meaning_corpus --check    # exits 1 if the committed files differ, or a query breaks its rule

`bench/search-corpus` measures queries written from a tool's own words; this one measures the others: what a
user says when they do not know how the tool was described ("will I need an umbrella in Lisbon tomorrow" for a
weather forecast). Hand-written, not generated from the tools, and not written against any model's output.

Two kinds of query, each with exactly one right tool:

- `meaning`: shares no content word with its tool's searchable text (name split into words, title, description,
  arguments' names and descriptions). Checked here, not trusted: both sides are lower-cased, split into words,
  stripped of `CHECK_STOP_WORDS` (English function words, broader than the index's own list) and stemmed with the
  index's Snowball English stemmer, and a query whose stems meet its tool's is refused (`--check` fails).
- `twin`: names one of a pair of tools that differ by one action on the same thing (create or cancel an event,
  send or draft an email); it may share words with both. `wrong` names the other twin: the right one must rank
  above it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "meaning-corpus"

CHECK_STOP_WORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being below between both but by can
    could did do does doing down during each few for from further had has have having he her here hers him his how i
    if in into is it its itself just me more most my myself no nor not now of off on once only or other our ours out
    over own same she should so some such than that the their them then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your yours one
    please let lets get got want need like make made s t don doesn isn i'm it's can't won't""".split()
)
"""Words that carry no content: left out on both sides before a meaning query's words are compared with its tool's."""

# name, title, description, arguments ("name: description" joined by "; ")
TOOLS: list[tuple[str, str, str, str]] = [
    (
        "weather-forecast",
        "Weather forecast",
        "Forecast of temperature, rain and wind for a city over the coming days.",
        "city: City name; days: Number of days ahead, 1 to 7",
    ),
    (
        "weather-current",
        "Current conditions",
        "Temperature, humidity and sky conditions observed right now at a place.",
        "place: City or coordinates",
    ),
    (
        "air-quality",
        "Air quality index",
        "Pollution levels (PM2.5, ozone) and the air quality index for an area.",
        "area: City or postcode",
    ),
    ("tell-joke", "Tell a joke", "Returns a random joke, optionally on a given topic.", "topic: Optional subject"),
    ("random-quote", "Inspirational quote", "An inspirational quotation with its author.", "theme: Optional theme"),
    (
        "translate-text",
        "Translate text",
        "Translate a passage of text from one language to another.",
        "text: The text; target_language: Language code, e.g. fr",
    ),
    (
        "translate-document",
        "Translate a file",
        "Translate an uploaded document file into another language, keeping its layout.",
        "file_id: Identifier of the uploaded file; target_language: Language code, e.g. fr",
    ),
    ("detect-language", "Detect language", "Identify which language a piece of text is written in.", "text: The text"),
    ("calculate", "Calculator", "Evaluate an arithmetic expression.", "expression: e.g. (3 + 4) * 2"),
    ("add", "Add", "Add two values and return their sum.", "a: First value; b: Second value"),
    (
        "countdown",
        "Countdown",
        "Count down from a number, one step per second, and report when it reaches zero.",
        "start: Where to begin",
    ),
    (
        "unit-convert",
        "Convert units",
        "Convert a quantity between units of measure such as length, weight or temperature.",
        "value: The quantity; from_unit: e.g. km; to_unit: e.g. mi",
    ),
    (
        "ops-currency-convert",
        "Convert currency",
        "Convert an amount of money from one currency to another at today's exchange rate.",
        "amount: How much; from_currency: ISO code, e.g. USD; to_currency: ISO code, e.g. EUR",
    ),
    (
        "files-convert-pdf",
        "Convert a file to PDF",
        "Convert a Word, Excel or image file into a PDF.",
        "file_id: Identifier of the file to convert",
    ),
    ("timer.start", "Start a timer", "Start a timer that rings after the given duration.", "duration: e.g. 10m"),
    (
        "alarm.set",
        "Set an alarm",
        "Set an alarm to ring at a clock time, optionally repeating on weekdays.",
        "time: HH:MM; repeat: Days to repeat",
    ),
    ("time.now", "Current time", "The current local time and date in a time zone.", "zone: IANA zone, e.g. Asia/Tokyo"),
    (
        "time.zone-convert",
        "Convert time zones",
        "Convert a clock time from one time zone to another.",
        "time: The time; from_zone: IANA zone; to_zone: IANA zone",
    ),
    ("date.diff", "Days between dates", "Count the days between two dates.", "start: A date; end: A date"),
    (
        "holidays.list",
        "Public holidays",
        "List the public holidays of a country for a year.",
        "country: ISO code; year: Year",
    ),
    (
        "calendar.event.create",
        "Create an event",
        "Schedule a new event on the user's calendar and invite attendees.",
        "title: Event title; start: Start time; end: End time; attendees: Email addresses",
    ),
    (
        "calendar.event.cancel",
        "Cancel an event",
        "Cancel an existing calendar event and notify its attendees.",
        "event_id: The event; reason: Optional note to attendees",
    ),
    (
        "calendar.event.list",
        "List events",
        "List the events on the user's calendar between two dates.",
        "from: Start date; to: End date",
    ),
    (
        "calendar.free-slots",
        "Find free time",
        "Find open slots when every given person is available.",
        "people: Email addresses; duration: Length of the slot",
    ),
    (
        "mail.send",
        "Send an email",
        "Send an email message to its recipients right away.",
        "to: Recipients; subject: Subject line; body: Message text",
    ),
    (
        "mail.draft",
        "Draft an email",
        "Save an email as a draft, without sending it, to be reviewed and sent later.",
        "to: Recipients; subject: Subject line; body: Message text",
    ),
    (
        "mail.search",
        "Search mail",
        "Search the mailbox for emails by sender, subject or content.",
        "query: Search terms",
    ),
    (
        "helpdesk.ticket.create",
        "Open a ticket",
        "Open a new support ticket for a customer problem.",
        "subject: Summary; details: Description of the problem",
    ),
    (
        "helpdesk.ticket.delete",
        "Delete a ticket",
        "Permanently delete a support ticket. This cannot be undone.",
        "ticket_id: The ticket",
    ),
    (
        "helpdesk.ticket.archive",
        "Archive a ticket",
        "Move a resolved support ticket to the archive, where it stays read-only and can be restored.",
        "ticket_id: The ticket",
    ),
    (
        "helpdesk.ticket.assign",
        "Assign a ticket",
        "Assign a support ticket to an agent or team.",
        "ticket_id: The ticket; assignee: Agent or team",
    ),
    (
        "news.headlines",
        "News headlines",
        "Top news headlines, optionally for a category or country.",
        "category: e.g. business; country: ISO code",
    ),
    (
        "wiki.summary",
        "Encyclopedia summary",
        "A short summary of an encyclopedia article on a subject.",
        "subject: Article title",
    ),
    (
        "web.search",
        "Web search",
        "Search the web and return the top result links with snippets.",
        "query: Search terms",
    ),
    (
        "maps.directions",
        "Directions",
        "Route and travel time between two places by car, foot or transit.",
        "origin: Start address; destination: End address; mode: car, walk or transit",
    ),
    (
        "places.nearby",
        "Nearby places",
        "Find restaurants, shops or other places near a location.",
        "location: Address or coordinates; kind: e.g. restaurant",
    ),
    (
        "ride.book",
        "Book a ride",
        "Request a taxi or ride-share car to pick the user up.",
        "pickup: Address; dropoff: Address",
    ),
    (
        "food.order",
        "Order food delivery",
        "Order a meal from a restaurant for delivery.",
        "restaurant: Restaurant id; items: Dishes",
    ),
    ("recipe.search", "Find recipes", "Search recipes by ingredient, cuisine or diet.", "ingredients: Comma separated"),
    (
        "nutrition.facts",
        "Nutrition facts",
        "Calories, protein, fat and carbohydrates in a food.",
        "food: Food name; grams: Amount",
    ),
    ("dictionary.define", "Define a word", "The definition and pronunciation of an English word.", "word: The word"),
    ("thesaurus.synonyms", "Synonyms", "Words with a similar sense to the given word.", "word: The word"),
    (
        "grammar.check",
        "Check grammar",
        "Find spelling and grammar mistakes in text and suggest corrections.",
        "text: The text",
    ),
    (
        "text.summarize",
        "Summarize text",
        "Condense a long text into a few sentences.",
        "text: The text; sentences: How many",
    ),
    (
        "sentiment.analyze",
        "Sentiment analysis",
        "Whether a text is positive, negative or neutral in tone.",
        "text: The text",
    ),
    (
        "image.generate",
        "Generate an image",
        "Create a picture from a written prompt.",
        "prompt: What to draw; size: Pixels",
    ),
    ("image.caption", "Caption an image", "Describe in words what a picture shows.", "image_url: The picture"),
    (
        "ocr.extract",
        "Extract text from an image",
        "Read the printed or handwritten text in a scanned page or photo.",
        "image_url: The scan or photo",
    ),
    ("audio.transcribe", "Transcribe audio", "Convert recorded speech into written text.", "audio_url: The recording"),
    (
        "speech.synthesize",
        "Text to speech",
        "Read text aloud as an audio file in a chosen voice.",
        "text: The text; voice: Voice id",
    ),
    ("qr.generate", "Make a QR code", "Encode a link or text as a QR code image.", "data: Link or text"),
    ("url.shorten", "Shorten a link", "Turn a long URL into a short one.", "url: The long URL"),
    (
        "password.generate",
        "Generate a password",
        "Create a strong random password.",
        "length: Characters; symbols: Include symbols",
    ),
    (
        "package.track",
        "Track a package",
        "Where a parcel is and when it will be delivered, by tracking number.",
        "tracking_number: Carrier tracking number",
    ),
    (
        "flights.search",
        "Search flights",
        "Find flights between two airports on a date, with prices.",
        "origin: Airport code; destination: Airport code; date: Departure date",
    ),
    (
        "flights.booking.create",
        "Book a flight",
        "Book a seat on a chosen flight and pay for it.",
        "flight_id: The flight; passenger: Full name",
    ),
    (
        "flights.booking.cancel",
        "Cancel a flight booking",
        "Cancel a flight booking and request the refund the fare allows.",
        "booking_id: The booking",
    ),
    (
        "hotels.search",
        "Search hotels",
        "Find hotels in a city for given dates, with prices and ratings.",
        "city: City; check_in: Date; check_out: Date",
    ),
    (
        "restaurant.reserve",
        "Reserve a table",
        "Reserve a table at a restaurant for a party at a time.",
        "restaurant: Restaurant id; party_size: People; time: When",
    ),
    (
        "movies.showtimes",
        "Movie showtimes",
        "Films playing at cinemas near a location today.",
        "location: City or postcode",
    ),
    (
        "music.play",
        "Play music",
        "Play a song, album, artist or playlist on the user's speaker.",
        "query: What to play",
    ),
    ("music.pause", "Pause music", "Pause whatever is playing on the user's speaker.", ""),
    ("podcast.search", "Find podcasts", "Search podcast episodes by topic or show.", "query: Topic or show"),
    ("sports.scores", "Sports scores", "Live and final scores of games for a team or league.", "team: Team or league"),
    (
        "stocks.quote",
        "Stock quote",
        "The latest share price and daily change of a listed company.",
        "symbol: Ticker symbol",
    ),
    (
        "workout.log",
        "Log a workout",
        "Record an exercise session with its duration and calories burned.",
        "activity: e.g. running; minutes: Duration",
    ),
    (
        "medication.reminder",
        "Medication reminder",
        "Remind the user to take a medicine at set times.",
        "medicine: Name; times: When to take it",
    ),
    (
        "ops-scale-deployment",
        "Scale a deployment",
        "Change the number of replicas of a Kubernetes deployment.",
        "deployment: Name; replicas: How many pods",
    ),
    ("ops-restart-service", "Restart a service", "Restart a running service's processes.", "service: Service name"),
    (
        "ops-logs-tail",
        "Tail logs",
        "Stream the latest log lines of a service.",
        "service: Service name; lines: How many",
    ),
    (
        "ops-rollback-release",
        "Roll back a release",
        "Return a service to its previous released version.",
        "service: Service name",
    ),
    ("ops-cpu-usage", "CPU usage", "Processor and memory utilisation of a host over the last hour.", "host: Hostname"),
    ("db.backup", "Back up a database", "Take a snapshot backup of a database.", "database: Database name"),
    ("db.query", "Run a SQL query", "Run a read-only SQL query and return the rows.", "sql: The statement"),
    ("code.run", "Run Python", "Execute a Python snippet in a sandbox and return its output.", "code: Python source"),
    (
        "code.lint",
        "Lint code",
        "Report style problems and likely bugs in source code.",
        "code: Source; language: e.g. python",
    ),
    (
        "git.pr.review",
        "Review a pull request",
        "Comment on a pull request's changes and approve or request changes.",
        "pr: Pull request number; verdict: approve or request-changes",
    ),
    (
        "secrets.rotate",
        "Rotate a secret",
        "Replace an API key or credential with a fresh one and revoke the old.",
        "secret: Secret name",
    ),
    ("dns.lookup", "DNS lookup", "Resolve a domain name to its IP addresses and records.", "domain: Domain name"),
    (
        "net.ping",
        "Ping a host",
        "Check whether a host answers and how long a round trip takes.",
        "host: Hostname or IP",
    ),
    (
        "tls.certificate.check",
        "Check a certificate",
        "When a site's TLS certificate expires and who issued it.",
        "domain: Domain name",
    ),
    (
        "accounts.user.create",
        "Create a user account",
        "Create an account for a new employee with default permissions.",
        "email: Work email; team: Team",
    ),
    ("accounts.password.reset", "Reset a password", "Send a user a link to set a new password.", "email: Work email"),
    (
        "files.upload",
        "Upload a file",
        "Upload a file from the user's computer to cloud storage.",
        "path: Local path; folder: Destination",
    ),
    (
        "files.download",
        "Download a file",
        "Download a file from cloud storage to the user's computer.",
        "file_id: The file",
    ),
    (
        "files.share",
        "Share a file",
        "Give another person access to a stored file by email.",
        "file_id: The file; email: Who",
    ),
    ("files.compress", "Zip files", "Pack several files into one zip archive.", "file_ids: The files"),
    (
        "sheets.append-row",
        "Append a row",
        "Add a row of values at the end of a spreadsheet.",
        "sheet_id: The sheet; values: Cells",
    ),
    (
        "chart.create",
        "Make a chart",
        "Draw a bar, line or pie chart from a table of numbers.",
        "data: The table; kind: bar, line or pie",
    ),
    (
        "crm.contact.lookup",
        "Look up a contact",
        "Find a customer contact's details in the CRM by name or company.",
        "name: Person or company",
    ),
    (
        "invoice.create",
        "Create an invoice",
        "Issue an invoice to a client for work or goods.",
        "client: Client; lines: Items and prices",
    ),
    (
        "expense.submit",
        "Submit an expense",
        "Submit a receipt for reimbursement.",
        "amount: Amount; receipt_url: Photo of the receipt",
    ),
    (
        "payments.charge",
        "Charge a card",
        "Take a payment from a customer's saved card.",
        "customer: Customer id; amount: Amount",
    ),
    (
        "payments.refund",
        "Refund a payment",
        "Return a customer's payment to their card, in full or in part.",
        "payment_id: The payment; amount: Optional part",
    ),
    (
        "hr.time-off.request",
        "Request time off",
        "Ask for vacation or leave days for approval.",
        "start: First day; end: Last day",
    ),
    (
        "rooms.book",
        "Book a meeting room",
        "Reserve an office meeting room for a time slot.",
        "room: Room; start: Start; end: End",
    ),
    ("chat.post", "Post to a channel", "Post a message in a team chat channel.", "channel: Channel; text: Message"),
    ("sms.send", "Send a text message", "Send an SMS to a phone number.", "phone: Number; text: Message"),
    ("phone.call", "Place a call", "Dial a phone number and connect the user.", "phone: Number"),
    ("notes.create", "Create a note", "Save a note with a title and body.", "title: Title; body: Text"),
    (
        "todo.add",
        "Add a to-do",
        "Add an item to the user's to-do list with an optional due date.",
        "item: The task; due: Optional date",
    ),
    ("shopping-list.add", "Add to shopping list", "Add groceries to the shared shopping list.", "items: Groceries"),
    (
        "home.lights.on",
        "Turn lights on",
        "Switch on the lights in a room of the smart home.",
        "room: Room name; brightness: Percent",
    ),
    ("home.lights.off", "Turn lights off", "Switch off the lights in a room of the smart home.", "room: Room name"),
    (
        "home.thermostat.set",
        "Set the thermostat",
        "Set the heating or cooling target temperature.",
        "celsius: Target temperature",
    ),
    ("home.door.lock", "Lock a door", "Lock a smart lock on a door of the house.", "door: Which door"),
    ("home.camera.snapshot", "Camera snapshot", "Take a still picture from a security camera.", "camera: Camera name"),
    (
        "home.vacuum.start",
        "Start the vacuum",
        "Send the robot vacuum cleaner to clean the floors.",
        "rooms: Optional rooms",
    ),
]

# query, tool, kind ("meaning", or "twin" with the wrong twin)
MEANING: list[tuple[str, str]] = [
    ("will I need an umbrella in Lisbon tomorrow", "weather-forecast"),
    ("is it going to be sunny this weekend in Rome", "weather-forecast"),
    ("should I pack a coat for Oslo next week", "weather-forecast"),
    ("how hot is it outside in Madrid at this moment", "weather-current"),
    ("is it safe to go jogging given the smog", "air-quality"),
    ("make me laugh", "tell-joke"),
    ("say something funny about cats", "tell-joke"),
    ("give me some words of wisdom to motivate me", "random-quote"),
    ("get this doc into Portuguese", "translate-document"),
    ("how do you say good morning in Japanese", "translate-text"),
    ("what tongue is this sentence in: 'dziękuję bardzo'", "detect-language"),
    ("multiply two numbers", "calculate"),
    ("what is 17 percent of 240", "calculate"),
    ("square root of 1764", "calculate"),
    ("how many kilos is 150 pounds", "unit-convert"),
    ("how many miles is a marathon of 42 kilometres", "unit-convert"),
    ("what are 50 pounds sterling worth in yen", "ops-currency-convert"),
    ("turn this spreadsheet into something printable and uneditable", "files-convert-pdf"),
    ("wake me at 6:30 tomorrow", "alarm.set"),
    ("remind me in ten minutes that the pasta is ready", "timer.start"),
    ("what hour is it over in Seoul", "time.now"),
    ("if it's 9am in New York what hour is it in Berlin", "time.zone-convert"),
    ("how long until Christmas", "date.diff"),
    ("which days are the banks shut in Ireland in 2027", "holidays.list"),
    ("set up a meeting with Ana on Friday at 3", "calendar.event.create"),
    ("call off tomorrow's standup", "calendar.event.cancel"),
    ("what's on my agenda this week", "calendar.event.list"),
    ("when are Bob and Carla both around for half an hour", "calendar.free-slots"),
    ("fire off a note to the team that the build is fixed", "mail.send"),
    ("write up a reply to Ana but hold it so I can look it over first", "mail.draft"),
    ("did the landlord write to me about the deposit", "mail.search"),
    ("a client says their login is broken, log that so someone looks into it", "helpdesk.ticket.create"),
    ("hand case 4411 over to the billing people", "helpdesk.ticket.assign"),
    ("what's happening in the world today", "news.headlines"),
    ("tell me briefly who Ada Lovelace was", "wiki.summary"),
    ("look up online reviews of the Framework laptop", "web.search"),
    ("how do I drive to the airport from here", "maps.directions"),
    ("is there a pharmacy close to me", "places.nearby"),
    ("I need a cab to the station", "ride.book"),
    ("get me a pizza delivered", "food.order"),
    ("what can I cook with leftover rice and eggs", "recipe.search"),
    ("how many kcal in a banana", "nutrition.facts"),
    ("what does 'ephemeral' mean", "dictionary.define"),
    ("another way to say 'happy'", "thesaurus.synonyms"),
    ("proofread my cover letter", "grammar.check"),
    ("give me the gist of this article", "text.summarize"),
    ("are these customer reviews angry or pleased", "sentiment.analyze"),
    ("paint me a cat riding a bicycle", "image.generate"),
    ("what is in this photo", "image.caption"),
    ("pull the writing out of this photographed receipt", "ocr.extract"),
    ("write down what was said in this voice memo", "audio.transcribe"),
    ("say this paragraph out loud", "speech.synthesize"),
    ("make a scannable square for our wifi password", "qr.generate"),
    ("this address is too big to tweet, make it compact", "url.shorten"),
    ("I need a secure login secret for the new router", "password.generate"),
    ("my order from Zalando still hasn't arrived, where is it", "package.track"),
    ("cheapest way to fly from Paris to Montreal in May", "flights.search"),
    ("somewhere to stay in Kyoto for three nights", "hotels.search"),
    ("what can we watch at the pictures tonight", "movies.showtimes"),
    ("put on some jazz", "music.play"),
    ("who won the match last night", "sports.scores"),
    ("how is Apple trading on the market today", "stocks.quote"),
    ("I just ran 5k in 28 min, note that in my fitness diary", "workout.log"),
    ("make sure I don't forget my pills at 8 and 20", "medication.reminder"),
    ("checkout needs more capacity, bump it to 10 instances", "ops-scale-deployment"),
    ("bounce the payments api", "ops-restart-service"),
    ("show me what the auth server printed recently", "ops-logs-tail"),
    ("the deploy broke everything, undo it", "ops-rollback-release"),
    ("is web-3 overloaded", "ops-cpu-usage"),
    ("save a copy of the orders data before the migration", "db.backup"),
    ("how many orders did we get yesterday, ask the warehouse tables", "db.query"),
    ("try this script and tell me what it prints", "code.run"),
    ("which server number does example.org point at", "dns.lookup"),
    ("is the server at 10.0.0.5 reachable", "net.ping"),
    ("when does our https cert run out", "tls.certificate.check"),
    ("Maria starts Monday, set her up with a login", "accounts.user.create"),
    ("Tom forgot his credentials, help him in", "accounts.password.reset"),
    ("put these photos online so they're backed up", "files.upload"),
    ("bundle these documents into a single smaller package", "files.compress"),
    ("plot monthly revenue as a graph", "chart.create"),
    ("what's the phone number of our rep at Acme", "crm.contact.lookup"),
    ("bill Globex for 12 hours of consulting", "invoice.create"),
    ("I paid for the team lunch, get my money back from the company", "expense.submit"),
    ("I'd like a holiday the opening week of August", "hr.time-off.request"),
    ("tell the #ops folks the deploy is done", "chat.post"),
    ("ring my mother", "phone.call"),
    ("jot this down: gate code 4512", "notes.create"),
    ("we're out of milk and bread", "shopping-list.add"),
    ("it's too dark in the kitchen", "home.lights.on"),
    ("it's freezing in here, warm the house up", "home.thermostat.set"),
    ("is the front entrance secured? bolt it", "home.door.lock"),
    ("show me who's at the gate right now", "home.camera.snapshot"),
    ("get the dust and crumbs up from the carpet", "home.vacuum.start"),
]

TWINS: list[tuple[str, str, str]] = [
    ("put a dentist appointment in my calendar for Tuesday", "calendar.event.create", "calendar.event.cancel"),
    ("schedule a review with the design team", "calendar.event.create", "calendar.event.cancel"),
    ("call off the review with the design team", "calendar.event.cancel", "calendar.event.create"),
    (
        "the Tuesday dentist appointment is not happening any more, remove it and tell everyone",
        "calendar.event.cancel",
        "calendar.event.create",
    ),
    ("email Ana the report now", "mail.send", "mail.draft"),
    ("mail the invoice to the client immediately", "mail.send", "mail.draft"),
    ("prepare an email to the client but keep it unsent for now", "mail.draft", "mail.send"),
    ("write an email to Ana that I can check before it goes out", "mail.draft", "mail.send"),
    ("get rid of ticket 812 for good", "helpdesk.ticket.delete", "helpdesk.ticket.archive"),
    ("erase the spam ticket forever", "helpdesk.ticket.delete", "helpdesk.ticket.archive"),
    ("the ticket is solved, file it away but keep it readable", "helpdesk.ticket.archive", "helpdesk.ticket.delete"),
    (
        "put the closed ticket into storage so we can look at it later",
        "helpdesk.ticket.archive",
        "helpdesk.ticket.delete",
    ),
    ("convert 100 dollars to euros", "ops-currency-convert", "files-convert-pdf"),
    ("convert 250 Swiss francs to dollars", "ops-currency-convert", "files-convert-pdf"),
    ("how many euros do I get for 80 pounds", "ops-currency-convert", "files-convert-pdf"),
    ("convert the contract.docx file to pdf", "files-convert-pdf", "ops-currency-convert"),
    ("convert this excel sheet into a document I can print", "files-convert-pdf", "ops-currency-convert"),
    ("book me on the 9am flight to Boston", "flights.booking.create", "flights.booking.cancel"),
    ("I can no longer travel, drop my flight reservation", "flights.booking.cancel", "flights.booking.create"),
    ("charge the customer's card 40 dollars", "payments.charge", "payments.refund"),
    ("give the customer their money back for order 77", "payments.refund", "payments.charge"),
    ("turn the bedroom lights on", "home.lights.on", "home.lights.off"),
    ("kill the lights in the bedroom, I'm going to sleep", "home.lights.off", "home.lights.on"),
    ("send my vacation photos to the cloud drive", "files.upload", "files.download"),
    ("save the quarterly report from the drive to my laptop", "files.download", "files.upload"),
    ("start the music", "music.play", "music.pause"),
    ("stop the song for a second, the phone is ringing", "music.pause", "music.play"),
    ("translate 'where is the station' into German", "translate-text", "translate-document"),
    ("translate the uploaded brochure into Spanish", "translate-document", "translate-text"),
]


def analysed(text: str) -> set[str]:
    """Content stems: lower case, split on what is not a letter or digit, `CHECK_STOP_WORDS` out, Snowball English."""
    import tantivy

    words = [w for w in re.split(r"[^\w]+|_", text.lower()) if w and w not in CHECK_STOP_WORDS]
    stemmer = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).filter(tantivy.Filter.stemmer("english")).build()
    )
    return {stem for word in words for stem in stemmer.analyze(word)}


def tool_text(tool: dict[str, Any]) -> str:
    """Everything of a tool the index searches: name (as words), title, description, arguments."""
    from toolservice_base.search.text import name_words

    arguments = " ".join(f"{name_words(a['name'])} {a['description']}" for a in tool["arguments"])
    return f"{name_words(tool['name'])} {tool['title']} {tool['description']} {arguments}"


def make() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools = []
    for name, title, description, arguments in TOOLS:
        args = [dict(zip(("name", "description"), a.split(": ", 1), strict=True)) for a in arguments.split("; ") if a]
        tools.append(
            {
                "type": "tool-service",
                "name": name,
                "title": title,
                "description": description,
                "service": "assistant",
                "arguments": [{"name": a["name"], "type": "string", "description": a["description"]} for a in args],
            }
        )
    queries: list[dict[str, Any]] = [{"query": q, "tool": t, "kind": "meaning"} for q, t in MEANING]
    queries += [{"query": q, "tool": t, "kind": "twin", "wrong": w} for q, t, w in TWINS]
    return tools, queries


def broken(tools: list[dict[str, Any]], queries: list[dict[str, Any]]) -> list[str]:
    """Queries that break their rule: an unknown tool, or a meaning query sharing a content word with its tool."""
    texts = {t["name"]: analysed(tool_text(t)) for t in tools}
    problems = []
    for q in queries:
        for name in (q["tool"], q.get("wrong", q["tool"])):
            if name not in texts:
                problems.append(f"{q['query']!r}: no tool {name}")
        if q["kind"] == "meaning" and q["tool"] in texts and (shared := analysed(q["query"]) & texts[q["tool"]]):
            problems.append(f"{q['query']!r} shares {sorted(shared)} with {q['tool']}")
    return problems


def dump(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.meaning_corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the files differ or a query breaks its rule")
    args = parser.parse_args(argv)
    tools, queries = make()
    problems = broken(tools, queries)
    for problem in problems:
        print(f"meaning corpus: {problem}", file=sys.stderr)
    files = {HERE / "tools.json": dump(tools), HERE / "queries.json": dump(queries)}
    if args.check:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(
                f"meaning corpus out of date: {', '.join(stale)}; run python -m bench.meaning_corpus", file=sys.stderr
            )
        return 1 if stale or problems else 0
    if problems:
        return 1
    HERE.mkdir(exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    print(f"wrote {len(tools)} tools and {len(queries)} queries to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
