"""Running Markdown pages' fenced code blocks as a reader pastes them (imported as `support.readme`).

The blocks run in order (a page's, then the next page's), in one directory, as one reader's session:

- shell blocks (`sh`, `bash`) go to one bash process, a command at a time
  (a line, with its `\\` continuations or its here-document), as a person pastes
  them into one terminal: a command ending in `&` runs in the background, and
  the next one is pasted once it is ready, as a person waits for it (`toolreg
  up` says `ready in`, a service logs that it announced or listens, `toolreg
  mcp --http` prints its address). Every other command must exit 0.
- Python blocks are saved as files and run with the session's `python`;
- JSON blocks must parse.

A block that cannot run as it is says so in an HTML comment on the line just
above it, which the runner honours:

- `<!-- readme-test: skip REASON -->`: not run (a Python block is still compiled). A reason is required.
- `<!-- readme-test: file NAME -->`: saved as NAME in the directory, for the blocks after it to use.
- `<!-- readme-test: background -->`: a Python block run in the background while the next block runs; it must end
  well by the end of that block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^<!--\s*readme-test:\s*(skip|file|background)\b\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```(\S*)\s*$")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
BACKGROUND = re.compile(r"(?<![&|])&\s*(#.*)?$")
READY = ("ready in ", '"event": "service.announced"', '"event": "service.listening"', "mcp           http")
"""What a background `toolreg` process prints once it is up, whichever it is."""
SHELLS = ("sh", "bash")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int
    """The line of its opening fence, for messages."""
    marker: str | None = None
    argument: str = ""
    page: str = "README.md"
    """The page it is on, for messages."""


def blocks(markdown: str, page: str = "README.md") -> list[Block]:
    """Every fenced block of `markdown` (the text of `page`), with the marker comment just above it, if any."""
    found: list[Block] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        above = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marked = MARKER.match(above)
        found.append(
            Block(
                language=opening.group(1),
                text="\n".join(lines[index + 1 : end]) + "\n",
                line=index + 1,
                marker=marked.group(1) if marked else None,
                argument=marked.group(2) if marked else "",
                page=page,
            )
        )
        index = end + 1
    return found


def commands(script: str) -> list[str]:
    """A shell block as a person pastes it: one command per line, continuations and here-documents kept whole."""
    found: list[str] = []
    lines = script.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while (line.endswith("\\") or _open_quote(line)) and index < len(lines):
            # The backslash kept: bash joins the lines, as it does pasted; a quote left open goes on to its close.
            line = line + "\n" + lines[index]
            index += 1
        heredoc = HEREDOC.search(line)
        if heredoc is not None:
            body = []
            while index < len(lines) and lines[index].strip() != heredoc.group(1):
                body.append(lines[index])
                index += 1
            line = "\n".join([line, *body, heredoc.group(1)])
            index += 1
        found.append(line)
    return found


def _open_quote(line: str) -> bool:
    """Whether `line` leaves a quoted string open (a value written over several lines), as bash reads it."""
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return True
    return False


class Session:
    """One bash process, as a reader's terminal; its output (and its background jobs') goes to `log`."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._handle = open(log, "ab")
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self._handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.cwd = cwd

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def output_since(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace")

    def run(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        """Paste `command` and wait for its prompt back: its exit status and what was printed meanwhile."""
        offset = self.log.stat().st_size
        done = f"__readme_done_{uuid.uuid4().hex}__"
        self._send(f"{command}\nprintf '\\n{done} %s\\n' $?\n")
        deadline = time.monotonic() + timeout
        pattern = re.compile(rf"{done} (\d+)")
        while time.monotonic() < deadline:
            said = self.output_since(offset)
            finished = pattern.search(said)
            if finished is not None:
                return int(finished.group(1)), said[: finished.start()]
            if self.process.poll() is not None:
                raise AssertionError(f"the shell ended while running {command!r}: {said[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{command!r} did not finish within {timeout:g}s: {self.output_since(offset)[-3000:]}")

    def start(self, command: str, timeout: float = 30.0) -> None:
        """Paste a background command, then wait until what it started says it is ready."""
        offset = self.log.stat().st_size
        status, _ = self.run(command)
        assert status == 0, f"{command!r} could not be started"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(ready in self.output_since(offset) for ready in READY):
                return
            time.sleep(0.05)
        raise AssertionError(f"{command!r} did not say it was ready within {timeout:g}s: {self.output_since(offset)}")

    def close(self) -> None:
        """Stop every process the session started (SIGTERM, as Ctrl-C or closing the terminal would; then SIGKILL)."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 15
        while _left_in(self.cwd) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in _left_in(self.cwd):
            with _gone():
                os.kill(pid, signal.SIGKILL)
        with _gone():
            os.killpg(self.process.pid, signal.SIGKILL)
        self._handle.close()


class _gone:
    """Ignore a process that has already ended."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: object, trace: object) -> bool:
        return isinstance(error, ProcessLookupError)


def _left_in(directory: Path) -> list[int]:
    """Processes still running in `directory` (what the session started, and what those started: a broker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")).is_relative_to(directory):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_blocks(found: list[Block], session: Session) -> list[str]:
    """Run `found` in order in `session`; returns what was skipped, with why. Fails on the first block that fails."""
    skipped: list[str] = []
    waiting: list[tuple[Block, str]] = []  # background Python blocks, and the variable holding their pid
    for number, block in enumerate(found):
        where = f"{block.page} line {block.line}"
        if block.marker == "skip":
            assert block.argument, f"{where}: a skipped block must say why"
            if block.language == "python":
                compile(block.text, where, "exec")
            skipped.append(f"{where}: {block.argument}")
            continue
        if block.language == "json":
            json.loads(block.text)
            continue
        if block.language == "python":
            name = block.argument if block.marker == "file" else f"readme_block_{number}.py"
            (session.cwd / name).write_text(block.text)
            if block.marker == "background":
                status, _ = session.run(f"python {shlex.quote(name)} & readme_pid_{number}=$!")
                assert status == 0, f"{where}: could not start"
                waiting.append((block, f"readme_pid_{number}"))
            elif block.marker != "file":
                _expect(session, f"python {shlex.quote(name)}", where)
            continue
        assert block.language in SHELLS, f"{where}: a ```{block.language} block the runner cannot run; mark it"
        for command in commands(block.text):
            if BACKGROUND.search(command.splitlines()[0] if "<<" in command else command):
                session.start(command)
            else:
                _expect(session, command, where)
        for background, variable in waiting:
            _expect(session, f"wait ${variable}", f"{background.page} line {background.line} (in the background)")
        waiting = []
    assert not waiting, "a background block must be followed by a block it runs beside"
    return skipped


def _expect(session: Session, command: str, where: str) -> None:
    status, said = session.run(command)
    assert status == 0, f"{where}: {command!r} exited {status}:\n{said[-4000:]}"
