"""Practice tasks: short multi-turn tool tasks on BFCL's own back ends, generated from a seed.

A setting small enough for a model built from scratch to learn on a laptop, with everything downstream
unchanged: a practice task is a `seal_mini.envs.bfcl.Task` over the real back-end classes (file system, math,
messaging, tickets, trading, vehicle), its ground truth is BFCL call strings, and the official multi_turn_checker
scores it through the same Episode, verifier, diagnoser and interface.

Each task offers the tools its requests use (and one distractor when they use a single tool), with compact docs
(BFCL's own docs, cut to their first sentence), and has 2-4 user turns in varied wording, with the phenomena of
BFCL's four categories and the failure modes BFCL's back ends set up: preconditions a request leaves unsaid (a
file in a folder needs a `cd` first, after which the session is in that folder; the engine needs the brake
pressed), allowed values a request does not spell as the tool does ("automatic" for auto, "words" for wc's w,
"start" for START), and values a user leaves out that a model is tempted to make up instead of asking. Everything
is kept short (a demonstration is about 240 tokens for the scratch tokenizer), since sequence length is what a
CPU pays for:
  base          plain requests;
  miss_param    a request leaves out a value it needs (the right move is to ask, no call); the next turn gives it;
  miss_func     a request needs a tool that is not offered (no call); the next turn reveals the tool, with BFCL's
                own reveal text (a tool that changes the state: BFCL never checks a turn that needs no call, so
                a read-only one called early would pass);
  long_context  a larger initial state (many files, tickets, contacts, ...), whose listing the task reads. It is
                our own larger state, not BFCL's long filler, which would not fit a small model: the task's
                `long_context` flag is off, and no id contains "long_context" (the checker switches the filler
                on from the id).

Task ids are `practice_<seed>_<side>_<slug>_<n>` (side: train or heldin); a task is a function of its id alone,
so a split file or a log line names it exactly. The held-in set leaves out any task whose turns and ground truth
equal a training task's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from dataclasses import dataclass
from functools import cache

from seal_mini.config import CATEGORIES, Config, ConfigError
from seal_mini.envs.bfcl import Task, tool_docs
from seal_mini.envs.scripted import ground_truth_effects

PREFIX = "practice"
SIDES = ("train", "heldin")
SLUGS = {"base": "base", "miss_func": "miss_func", "miss_param": "miss_param", "long_context": "large_state"}
"""Category -> its name in task ids (never "long_context": the checker reads that as BFCL's filler flag)."""
_ID = re.compile(rf"^{PREFIX}_(\d+)_({'|'.join(SIDES)})_({'|'.join(SLUGS.values())})_(\d+)$")


@dataclass
class PracticeTask(Task):
    """A BFCL Task whose long_context category is a larger state of our own, never BFCL's filler."""

    @property
    def long_context(self) -> bool:
        return False


@dataclass
class Request:
    """One user request and the ground-truth calls that fulfil it."""

    text: str
    calls: list[str]
    """BFCL call strings, keyword arguments only."""
    ask: str = ""
    """The same request with one needed value left out (for miss_param)..."""
    answer: str = ""
    """...and the user's next turn, which gives it."""

    @property
    def tools(self) -> list[str]:
        return [c.split("(", 1)[0] for c in self.calls]


def call(tool: str, /, **arguments) -> str:
    """A ground-truth call string in BFCL's form: name(key=value, ...), values as Python literals."""
    return f"{tool}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def compact_doc(doc: dict) -> dict:
    """A BFCL tool doc cut to the first sentence of its description; a parameter keeps its description only
    where it lists the allowed values ([Enum]); names, types and required parameters as published."""
    params = doc.get("parameters", {"type": "dict", "properties": {}})
    properties = {}
    for name, spec in params.get("properties", {}).items():
        enum = re.search(r"\[Enum\]: (\[.*?\])", spec.get("description", ""))
        spec = {k: v for k, v in spec.items() if k not in ("default", "description")}
        if enum:
            spec["description"] = enum.group(0)
            # the same values as a JSON-schema enum (on the items of an array), so an argument outside them is a
            # schema violation the diagnoser names (argument_mismatch) and the schema cue can show
            if spec.get("type") == "array":  # a copy: the items dict is BFCL's own doc, shared with its tasks
                spec["items"] = target = dict(spec.get("items", {}))
            else:
                target = spec
            target["enum"] = json.loads(enum.group(1))
        properties[name] = spec
    out = {"type": params.get("type", "dict"), "properties": properties}
    if params.get("required"):
        out["required"] = list(params["required"])
    description = doc["description"].split("Tool description:", 1)[-1].strip()
    description = re.split(r"(?<=\.)\s", description, maxsplit=1)[0].strip()  # its first sentence
    return {"name": doc["name"], "description": description, "parameters": out}


# --- LEARNER EDIT POINT: the practice world ---------------------------------------------------------
# Each domain is one BFCL back end: a small world (its initial state, tracked as requests change it)
# and the requests a user can make of it. A request method returns None when the world does not
# allow it right now (nothing left to delete, ...); the generator then picks another.

NOUNS = ["apple", "bread", "candle", "garden", "guitar", "lemon", "pencil", "rocket", "silver", "violin"]
"""The values a call copies from a request: file and folder names, file contents, ticket titles, notes, messages,
search words. One word each (one token for the scratch tokenizer): a model built from scratch learns to copy a
word it has seen many times within minutes, a phrase only much later. LEARNER EDIT POINT: the world's difficulty;
a larger pool (try a hundred words) makes it learn to copy any word, slowly."""
EXTENSIONS = ["txt", "md"]
FILE_NAMES = [f"{noun}.{ext}" for noun in NOUNS for ext in EXTENSIONS]
LINES = ["buy milk", "call the bank", "meeting at noon", "fix the printer", "send the invoice", "water plants"]
LINES += ["book a room", "pay rent", "clean the desk", "read chapter two", "plan the trip", "update the site"]
"""Lines of the files a task starts with (read back by cat, never copied into a call)."""
PEOPLE = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Oscar", "Peggy"]
COMPANIES = {"Apple": "AAPL", "Google": "GOOG", "Tesla": "TSLA", "Microsoft": "MSFT", "Nvidia": "NVDA"}
SYMBOLS = ["AAPL", "ALPH", "GOOG", "MSFT", "NEPT", "NVDA", "OMEG", "QUAS", "SYNX", "TSLA", "ZETA"]
"""The stocks of the trading back end's default state."""
DOORS = ["driver", "passenger", "rear_left", "rear_right"]


class Domain:
    """A back end, its world, and the requests a user makes of it."""

    cls = ""
    tools: tuple[str, ...] = ()
    """Tools this domain offers: the ones its requests use, and distractors."""

    def __init__(self, rng: random.Random, large: bool):
        self.rng = rng
        self.focus = None
        """What the session is about (a file, a ticket, a person, a stock): later requests return to it."""

    def pick(self, options):
        """The focus when it is one of the options, else a random option, which becomes the focus. A task
        is a short session about one thing, as a user's session with a tool usually is."""
        options = sorted(options)
        if self.focus not in options:
            self.focus = self.rng.choice(options)
        return self.focus

    def config(self) -> dict:
        """The back end's initial state, as BFCL's initial_config holds it."""
        return {}

    def requests(self) -> list:
        """The request methods (each returns a Request or None)."""
        return [getattr(self, name) for name in sorted(dir(self)) if name.startswith("req_")]

    def listing(self) -> Request | None:
        """A request that reads the (large) state, for the long_context category."""
        return None


class Files(Domain):
    """A workspace with files and folders. Requests act in the current folder; a request about a file in
    another folder needs a `cd` first (a precondition the request does not spell out), and later requests
    of the session act in that folder, as BFCL's file system does."""

    cls = "GorillaFileSystem"
    tools = ("ls", "cd", "mkdir", "touch", "echo", "cat", "rm", "mv", "wc")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        lines = lambda: "\n".join(rng.sample(LINES, rng.randint(1, 3)))  # noqa: E731
        stems = rng.sample(NOUNS, rng.randint(4, 5) if large else rng.randint(1, 2))
        self.tree: dict[str, dict[str, str]] = {"": {f"{n}.{rng.choice(EXTENSIONS)}": lines() for n in stems}}
        """Folder ("" = the workspace itself, else a folder in it) -> file name -> content."""
        folders = rng.sample([n for n in NOUNS if n not in stems], 2 if large else rng.randint(1, 2))
        for d in folders:
            self.tree[d] = {}
            if rng.random() < 0.8:  # most folders hold a file
                self.tree[d][self._new_name(FILE_NAMES)] = lines()
        self.cwd = ""
        self.initial = {d: dict(f) for d, f in self.tree.items()}

    @property
    def files(self) -> dict[str, str]:
        """The files of the current folder."""
        return self.tree[self.cwd]

    def config(self):
        def contents(files: dict[str, str]) -> dict:
            return {n: {"type": "file", "content": c} for n, c in files.items()}

        root = contents(self.initial[""])
        root |= {d: {"type": "directory", "contents": contents(f)} for d, f in sorted(self.initial.items()) if d}
        return {self.cls: {"root": {"workspace": {"type": "directory", "contents": root}}}}

    def _new_name(self, pool):
        taken = {n for files in self.tree.values() for n in files} | set(self.tree)
        while True:  # the pools are large: a free name comes at once
            name = self.rng.choice(pool)
            if name not in taken:
                return name

    def _folders(self, need_file: bool) -> list[str]:
        """Folders a request from the workspace can go into (with a file to read, if need_file)."""
        if self.cwd:  # one folder level: a session goes into at most one folder
            return []
        return [d for d, files in self.tree.items() if d and (not need_file or any(files.values()))]

    def req_mkdir(self):
        if self.cwd:
            return None
        d = self._new_name(NOUNS)
        self.tree[d] = {}
        text = self.rng.choice(["Make a folder called {}.", "Create a new directory named {}.", "I need a folder {}."])
        return Request(text.format(d), [call("mkdir", dir_name=d)], "Please make a new folder.", f"Call it {d}.")

    def req_touch(self):
        f = self._new_name(FILE_NAMES)
        self.files[f] = ""
        self.focus = f
        text = self.rng.choice(["Create an empty file named {}.", "Make a new file {}.", "Add a blank file called {}."])
        return Request(text.format(f), [call("touch", file_name=f)], "Create an empty file for me.", f"Name it {f}.")

    def req_write(self):
        f, line = self._new_name(FILE_NAMES), self.rng.choice(NOUNS)
        self.files[f] = line
        self.focus = f
        text = self.rng.choice(["Create {} and write '{}' in it.", "Make a file {} that says '{}'."])
        calls = [call("touch", file_name=f), call("echo", content=line, file_name=f)]
        return Request(text.format(f, line), calls, f"Create {f} and write a line in it.", f"The line is '{line}'.")

    def req_cat(self):
        full = [n for n, c in self.files.items() if c]
        if not full:
            return None
        f = self.pick(full)
        text = self.rng.choice(["Show me what {} says.", "What is in {}?", "Print the contents of {}."])
        return Request(text.format(f), [call("cat", file_name=f)])

    def req_rm(self):
        if not self.files:
            return None
        f = self.pick(self.files)
        del self.files[f]
        text = self.rng.choice(["Delete {}.", "Remove the file {}.", "Get rid of {}, please."])
        return Request(text.format(f), [call("rm", file_name=f)])

    def req_mv(self):
        if not self.files:
            return None
        new = self._new_name(FILE_NAMES)
        f = self.pick(self.files)
        self.files[new] = self.files.pop(f)
        self.focus = new
        text = self.rng.choice(["Rename {} to {}.", "Change the name of {} to {}."])
        return Request(text.format(f, new), [call("mv", source=f, destination=new)], f"Rename {f}.", f"Use {new}.")

    def req_wc(self):
        full = [n for n, c in self.files.items() if c]
        if not full:
            return None
        f = self.pick(full)
        unit, mode = self.rng.choice([("lines", "l"), ("words", "w"), ("characters", "c")])  # the mode is a letter
        text = self.rng.choice(["How many {} does {} have?", "Count the {} in {}."])
        return Request(text.format(unit, f), [call("wc", file_name=f, mode=mode)])

    def req_cat_in_folder(self):
        folders = self._folders(need_file=True)
        if not folders:
            return None
        d = self.rng.choice(sorted(folders))
        f = self.rng.choice(sorted(n for n, c in self.tree[d].items() if c))
        self.cwd, self.focus = d, f
        text = self.rng.choice(["What does {} in the {} folder say?", "Show me {} from the {} folder."])
        return Request(text.format(f, d), [call("cd", folder=d), call("cat", file_name=f)])

    def req_touch_in_folder(self):
        folders = self._folders(need_file=False)
        if not folders:
            return None
        d = self.rng.choice(sorted(folders))
        self.cwd = d
        f = self._new_name(FILE_NAMES)
        self.files[f] = ""
        self.focus = f
        text = self.rng.choice(
            ["In the {} folder, create an empty file {}.", "Add a blank file {1} to the {0} folder."]
        )
        calls = [call("cd", folder=d), call("touch", file_name=f)]
        return Request(text.format(d, f), calls, f"Create an empty file in the {d} folder.", f"Name it {f}.")

    def req_rm_in_folder(self):
        folders = [d for d in self._folders(need_file=False) if self.tree[d]]
        if not folders:
            return None
        d = self.rng.choice(sorted(folders))
        f = self.rng.choice(sorted(self.tree[d]))
        del self.tree[d][f]
        self.cwd = d
        text = self.rng.choice(["Delete {} from the {} folder.", "Remove {} in the {} folder."])
        return Request(text.format(f, d), [call("cd", folder=d), call("rm", file_name=f)])

    def listing(self):
        text = self.rng.choice(
            ["What is in my workspace?", "List the files here.", "Show me everything in this folder."]
        )
        return Request(text, [call("ls")])


class Math(Domain):
    cls = "MathAPI"
    tools = ("add", "subtract", "multiply", "mean", "max_value")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        self.last = None  # the previous result, for "then ... that"

    def _pair(self, name, op, fresh: list[str], chained: list[str], ask: str):
        """a (op) b: two new numbers, or (after an earlier result) that result and a new b."""
        a, b = self.rng.randint(2, 12), self.rng.randint(2, 9)
        if self.last is not None:
            a, self.last = self.last, op(self.last, b)
            return Request(self.rng.choice(chained).format(b=b), [call(name, a=a, b=b)])
        self.last = op(a, b)
        text = self.rng.choice(fresh).format(a=a, b=b)
        return Request(text, [call(name, a=a, b=b)], ask.format(a=a), f"The other number is {b}.")

    def req_add(self):
        fresh = ["What is {a} plus {b}?", "Add {a} and {b}."]
        chained = ["Now add {b} to that result.", "Then add {b} to it."]
        return self._pair("add", lambda a, b: a + b, fresh, chained, "Add {a} and another number.")

    def req_subtract(self):
        fresh = ["What is {a} minus {b}?", "Compute {a} minus {b}."]
        chained = ["Now subtract {b} from that result.", "Then take {b} away from the result."]
        return self._pair("subtract", lambda a, b: a - b, fresh, chained, "Compute {a} minus a number.")

    def req_multiply(self):
        fresh = ["What is {a} times {b}?", "Multiply {a} by {b}."]
        chained = ["Now multiply that result by {b}.", "Then multiply it by {b}."]
        return self._pair("multiply", lambda a, b: a * b, fresh, chained, "Multiply {a} by another number.")

    def req_mean(self):
        center, spread = self.rng.randint(3, 12), self.rng.randint(1, 2)
        numbers = [center - spread, center, center + spread]
        self.rng.shuffle(numbers)
        self.last = sum(numbers) / len(numbers)
        text = self.rng.choice(["What is the mean of {}?", "Average these numbers: {}."])
        shown = ", ".join(map(str, numbers))
        return Request(text.format(shown), [call("mean", numbers=numbers)])

    def req_max_value(self):
        numbers = self.rng.sample(range(1, 20), 3)
        self.last = max(numbers)
        text = self.rng.choice(["Which is the largest of {}?", "Find the maximum of {}."])
        return Request(text.format(", ".join(map(str, numbers))), [call("max_value", numbers=numbers)])


class Messages(Domain):
    cls = "MessageAPI"
    tools = ("list_users", "get_user_id", "send_message", "add_contact", "search_messages", "view_messages_sent")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        names = rng.sample(PEOPLE, rng.randint(6, 8) if large else rng.randint(3, 4))
        self.users = {name: f"USR{i + 1:03d}" for i, name in enumerate(names)}
        self.initial_users = dict(self.users)
        self.inbox = [{self.users[rng.choice(names[1:])]: rng.choice(NOUNS)} for _ in range(rng.randint(1, 3))]

    def config(self):
        state = {"user_count": len(self.initial_users), "user_map": dict(self.initial_users)}
        state |= {"inbox": [dict(m) for m in self.inbox], "message_count": len(self.inbox), "current_user": "USR001"}
        return {self.cls: state}

    def req_send(self):
        name = self.pick(n for n, i in self.users.items() if i != "USR001")  # USR001 is the user themself
        text = self.rng.choice(NOUNS)
        calls = [call("get_user_id", user=name), call("send_message", receiver_id=self.users[name], message=text)]
        phrase = self.rng.choice(["Send {} a message saying '{}'.", "Message {}: '{}'.", "Tell {} '{}'."])
        return Request(phrase.format(name, text), calls, f"Send {name} a message.", f"Say '{text}'.")

    def req_add_contact(self):
        free = [p for p in PEOPLE if p not in self.users]
        if not free:
            return None
        name = self.rng.choice(free)
        self.users[name] = f"USR{len(self.users) + 1:03d}"
        self.focus = name
        text = self.rng.choice(["Add {} to my contacts.", "Please add a contact named {}."])
        return Request(text.format(name), [call("add_contact", user_name=name)], "Add a new contact.", f"It is {name}.")

    def req_search(self):
        keyword = self.rng.choice(NOUNS)
        text = self.rng.choice(["Find messages that mention {}.", "Search my messages for {}."])
        return Request(text.format(keyword), [call("search_messages", keyword=keyword)])

    def req_user_id(self):
        name = self.pick(self.users)
        text = self.rng.choice(["What is the user id of {}?", "Look up the id of {}."])
        return Request(text.format(name), [call("get_user_id", user=name)])

    def listing(self):
        return Request(self.rng.choice(["Who is in this workspace?", "List all users."]), [call("list_users")])


class Tickets(Domain):
    cls = "TicketAPI"
    tools = ("create_ticket", "get_ticket", "close_ticket", "resolve_ticket", "get_user_tickets")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        self.user = rng.choice(["ana", "ben", "cleo", "dan"])
        titles = rng.sample(NOUNS, rng.randint(5, 6) if large else rng.randint(2, 3))
        self.queue = [
            dict(id=i + 1, title=t, description="", status="Open", priority=rng.randint(1, 5), created_by=self.user)
            for i, t in enumerate(titles)
        ]
        self.initial = json.loads(json.dumps(self.queue))
        self.open = {t["id"] for t in self.queue}

    def config(self):
        return {
            self.cls: {"ticket_queue": self.initial, "ticket_counter": len(self.initial) + 1, "current_user": self.user}
        }

    def req_create(self):
        title, priority = self.rng.choice(NOUNS), self.rng.randint(1, 5)
        new_id = len(self.queue) + 1
        self.queue.append({"id": new_id})
        self.open.add(new_id)
        self.focus = new_id
        text = self.rng.choice(
            ["Open a ticket titled '{}' with priority {}.", "Create a ticket '{}', priority {}."]
        ).format(title, priority)
        calls = [call("create_ticket", title=title, priority=priority)]
        return Request(text, calls, f"Open a ticket with priority {priority}.", f"The title is '{title}'.")

    def req_get(self):
        ticket = self.pick(t["id"] for t in self.queue)
        text = self.rng.choice(["What is the status of ticket {}?", "Show me ticket {}."])
        return Request(text.format(ticket), [call("get_ticket", ticket_id=ticket)])

    def req_close(self):
        if not self.open:
            return None
        ticket = self.pick(self.open)
        self.open.discard(ticket)
        text = self.rng.choice(["Close ticket {}.", "Please close ticket number {}."]).format(ticket)
        return Request(text, [call("close_ticket", ticket_id=ticket)], "Close a ticket.", f"Number {ticket}.")

    def req_resolve(self):
        if not self.open:
            return None
        ticket, note = self.pick(self.open), self.rng.choice(NOUNS)
        self.open.discard(ticket)
        text = self.rng.choice(["Resolve ticket {} with the note '{}'.", "Mark ticket {} resolved: '{}'."])
        calls = [call("resolve_ticket", ticket_id=ticket, resolution=note)]
        return Request(text.format(ticket, note), calls, f"Resolve ticket {ticket}.", f"The note is '{note}'.")

    def listing(self):
        text = self.rng.choice(["Show me my open tickets.", "Which of my tickets are open?"])
        return Request(text, [call("get_user_tickets", status="Open")])


class Trading(Domain):
    cls = "TradingBot"
    tools = ("get_symbol_by_name", "get_stock_info", "add_to_watchlist", "remove_stock_from_watchlist", "get_watchlist")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        self.watch = rng.sample(SYMBOLS, rng.randint(4, 5) if large else rng.randint(1, 2))
        self.initial = list(self.watch)

    def config(self):
        return {self.cls: {"authenticated": True, "watch_list": list(self.initial)}}

    def req_watch(self):
        free = [c for c, s in COMPANIES.items() if s not in self.watch]
        if not free:
            return None
        company = self.rng.choice(free)
        self.watch.append(COMPANIES[company])
        self.focus = COMPANIES[company]
        calls = [call("get_symbol_by_name", name=company), call("add_to_watchlist", stock=COMPANIES[company])]
        text = self.rng.choice(["Add {} to my watchlist.", "Put {} on my watchlist."]).format(company)
        return Request(text, calls, "Add a company to my watchlist.", f"It is {company}.")

    def req_price(self):
        symbol = self.pick(SYMBOLS)
        text = self.rng.choice(["How is {} doing?", "Get the stock info for {}."]).format(symbol)
        return Request(text, [call("get_stock_info", symbol=symbol)])

    def req_unwatch(self):
        if not self.watch:
            return None
        symbol = self.pick(self.watch)
        self.watch.remove(symbol)
        text = self.rng.choice(["Remove {} from my watchlist.", "Stop watching {}."]).format(symbol)
        return Request(text, [call("remove_stock_from_watchlist", symbol=symbol)])

    def listing(self):
        return Request(self.rng.choice(["What is on my watchlist?", "Show my watchlist."]), [call("get_watchlist")])


class Vehicle(Domain):
    cls = "VehicleControlAPI"
    tools = ("lockDoors", "pressBrakePedal", "startEngine", "setHeadlights", "fillFuelTank", "check_tire_pressure")

    def __init__(self, rng, large):
        super().__init__(rng, large)
        self.fuel = float(rng.randint(5, 30))
        self.locked = rng.random() < 0.5
        self.running = False
        self.lights = "off"
        self.initial = (self.fuel, self.locked)

    def config(self):
        fuel, locked = self.initial
        status = "locked" if locked else "unlocked"
        state = {"fuelLevel": fuel, "doorStatus": dict.fromkeys(DOORS, status)}
        state["remainingUnlockedDoors"] = 0 if locked else len(DOORS)
        return {self.cls: state}

    def req_lock(self):
        if self.locked:
            return None
        self.locked = True
        text = self.rng.choice(["Lock all the doors.", "Please lock every door of the car."])
        return Request(text, [call("lockDoors", unlock=False, door=list(DOORS))])

    def req_start(self):
        """The engine starts only with every door locked and the brake pressed: preconditions the request
        leaves unsaid (the first one the world keeps true: "start" is asked only of a locked car)."""
        if not self.locked or self.running:
            return None
        self.running = True
        text = self.rng.choice(["Start the engine.", "Get the engine running, please."])
        return Request(text, [call("pressBrakePedal", pedalPosition=1.0), call("startEngine", ignitionMode="START")])

    def req_lock_and_start(self):
        if self.locked or self.running:
            return None
        self.locked = self.running = True
        text = self.rng.choice(["Lock the car and start the engine.", "Lock every door, then start the engine."])
        calls = [call("lockDoors", unlock=False, door=list(DOORS)), call("pressBrakePedal", pedalPosition=1.0)]
        return Request(text, calls + [call("startEngine", ignitionMode="START")])

    def req_lights(self):
        mode = "off" if self.lights == "on" else self.rng.choice(["on", "auto"])
        self.lights = "on" if mode == "on" else "off"  # auto leaves them off until it is dark
        if mode == "auto":  # an allowed value the request does not spell as the tool does
            text = self.rng.choice(["Set the headlights to automatic.", "Let the headlights switch on by themselves."])
        else:
            text = self.rng.choice(["Turn the headlights {}.", "Switch the headlights {}."]).format(mode)
        return Request(text, [call("setHeadlights", mode=mode)])

    def req_fuel(self):
        amount = float(self.rng.randint(5, 15))
        if self.fuel + amount > 50:
            return None
        self.fuel += amount
        text = self.rng.choice(["Add {} gallons of fuel.", "Fill {} gallons into the tank."]).format(int(amount))
        calls = [call("fillFuelTank", fuelAmount=amount)]
        return Request(text, calls, "Put some fuel in the tank.", f"{int(amount)} gallons.")


DOMAINS = (Files, Math, Messages, Tickets, Trading, Vehicle)
LARGE = (Files, Messages, Tickets, Trading)
"""Domains with a state to make large and a request that reads it (long_context)."""
# --- end of the edit point ----------------------------------------------------------------------------


# --- generating one task -------------------------------------------------------------------------------


def _draw_requests(domain: Domain, n: int, rng: random.Random) -> list[Request]:
    """n requests, each a random request method the world allows now; at most one of each kind."""
    out, methods = [], domain.requests()
    rng.shuffle(methods)
    for method in methods:
        if len(out) == n:
            break
        request = method()
        if request is not None:
            out.append(request)
    return out


def _phenomenon_turn(category: str, requests: list[Request], rng: random.Random) -> int | None:
    """Which request shows the category's phenomenon: one with a value to leave out (miss_param), or one
    whose last tool is not used before it (miss_func); None for the other categories or if none can."""
    if category == "miss_param":
        options = [i for i, r in enumerate(requests) if r.ask]
    elif category == "miss_func":
        options = [i for i, r in enumerate(requests) if r.tools[-1] not in {t for q in requests[:i] for t in q.tools}]
    else:
        return None
    return rng.choice(options) if options else None


def generate(category: str, rng: random.Random, index: int, task_id: str) -> PracticeTask:
    """One practice task of a category, drawn from rng (worlds are drawn again until the category's
    phenomenon fits)."""
    missing = category in ("miss_param", "miss_func")
    while True:
        domain = rng.choice(LARGE if category == "long_context" else DOMAINS)(rng, large=category == "long_context")
        if category == "long_context":
            requests = [domain.listing()] + _draw_requests(domain, 1, rng)
        else:
            requests = _draw_requests(domain, 2 if missing else rng.randint(2, 3), rng)
        special = _phenomenon_turn(category, requests, rng)
        if len(requests) >= 2 and (special is not None or not missing):
            task = _build(category, domain, requests, special, rng, task_id, index)
            if category != "miss_func" or _withheld_call_changes_state(task):
                return task


def _build(category: str, domain, requests: list[Request], special, rng, task_id: str, index: int) -> PracticeTask:
    turns: list[list[dict]] = []
    truth: list[list[str]] = []
    held_out: dict[int, list[str]] = {}
    for i, request in enumerate(requests):
        if i == special and category == "miss_param":
            turns += [[{"role": "user", "content": request.ask}], [{"role": "user", "content": request.answer}]]
            truth += [[], request.calls]
        elif i == special:  # miss_func: no call now; the next turn reveals the tool (BFCL: no user text)
            turns += [[{"role": "user", "content": request.text}], []]
            truth += [[], request.calls]
            held_out[len(truth) - 1] = [request.tools[-1]]
        else:
            turns.append([{"role": "user", "content": request.text}])
            truth.append(request.calls)

    used = list(dict.fromkeys(r for request in requests for r in request.tools))
    distractors = [t for t in domain.tools if t not in used]
    offered = set(used) | set(rng.sample(distractors, min(len(distractors), 1 if len(used) == 1 else 0)))
    withheld = {t for names in held_out.values() for t in names}
    docs = {d["name"]: compact_doc(d) for d in tool_docs(domain.cls)}
    return PracticeTask(
        id=task_id,
        category=category,
        index=index,
        turns=turns,
        initial_config=domain.config(),
        involved_classes=[domain.cls],
        ground_truth=truth,
        tools=[docs[t] for t in domain.tools if t in offered and t not in withheld],
        held_out={turn: [docs[t] for t in names] for turn, names in held_out.items()},
    )


def _withheld_call_changes_state(task: PracticeTask) -> bool:
    """Whether the withheld tool's call changes its back end's state in the ground truth's run. A miss_func
    task withholds only such a tool: called before its reveal, it changes the state the reveal turn's check
    sees (it passes only where the reveal turn's calls leave the same state), where a read-only one always
    passes while the diagnoser names it spurious_tool_call, and the weight of that success (rho 2.0) would
    reinforce the premature call."""
    effects = ground_truth_effects(task)
    return all(effects[turn][-1].changes_state for turn in task.held_out)


def task_id(seed: int, side: str, category: str, index: int) -> str:
    return f"{PREFIX}_{seed}_{side}_{SLUGS[category]}_{index}"


@cache
def task(id_: str) -> PracticeTask:
    """The practice task with this id (generated; the same id always gives the same task)."""
    m = _ID.match(id_)
    if not m:
        raise ConfigError(f"{id_!r} is not a practice task id (practice_<seed>_<train|heldin>_<category>_<n>)")
    seed, side, slug, index = int(m.group(1)), m.group(2), m.group(3), int(m.group(4))
    category = next(c for c, s in SLUGS.items() if s == slug)
    rng = random.Random(f"{PREFIX}:{seed}:{side}:{category}:{index}")
    return generate(category, rng, index, id_)


def is_practice(id_: str) -> bool:
    return id_.startswith(PREFIX + "_")


def signature(t: Task) -> str:
    """What makes two tasks the same for a learner: the turns, ground truth and initial state."""
    return json.dumps([t.turns, t.ground_truth, t.initial_config], sort_keys=True)


def stream(seed: int, side: str, category: str, backends: tuple = ()):
    """Task ids of one side and category in index order; with `backends` (BFCL class names) only the tasks
    that use nothing else. A task keeps its id whatever the filter: the filter picks, it never changes one."""
    for index in itertools.count():
        id_ = task_id(seed, side, category, index)
        if not backends or set(task(id_).involved_classes) <= set(backends):
            yield id_


def first(ids, n: int) -> list[str]:
    return [next(ids) for _ in range(n)]


@cache
def make_split(
    seed: int,
    train_per_category: int,
    heldin_per_category: int,
    categories: tuple,
    seen_per_category: int = 0,
    backends: tuple = (),
) -> dict:
    """{"train": ids, "eval": ids}: seeded, separate streams (only tasks on `backends`, if given). The held-in
    set leaves out every task equal to one of the first max(train_per_category, seen_per_category) training
    tasks (those the warm start may have learned from too)."""
    seen_n = max(train_per_category, seen_per_category)
    seen_ids = {c: first(stream(seed, "train", c, backends), seen_n) for c in categories}
    train = [i for c in categories for i in seen_ids[c][:train_per_category]]
    seen = {signature(task(i)) for ids in seen_ids.values() for i in ids}
    held = []
    for c in categories:
        fresh = (i for i in stream(seed, "heldin", c, backends) if signature(task(i)) not in seen)
        held += first(fresh, heldin_per_category)
    return {"train": train, "eval": held}


def _categories(cfg: Config) -> tuple:
    return tuple(c for c in CATEGORIES if c in cfg.data.categories)


def backends(cfg: Config) -> tuple:
    """data.practice_backends, checked: () for all of them."""
    known = sorted(d.cls for d in DOMAINS)
    unknown = [b for b in cfg.data.practice_backends if b not in known]
    if unknown:
        raise ConfigError(f"data.practice_backends: unknown back end {unknown[0]!r}; choose from {known}")
    chosen = tuple(sorted(set(cfg.data.practice_backends)))
    if "long_context" in cfg.data.categories and chosen and not set(chosen) & {d.cls for d in LARGE}:
        raise ConfigError(
            f"data.practice_backends: long_context tasks need one of {sorted(d.cls for d in LARGE)} "
            "(a back end with a large state); add one, or leave long_context out of data.categories"
        )
    return chosen


def practice_split(cfg: Config) -> dict[str, list[str]]:
    """The run's practice train / held-in ids (data.source: practice)."""
    d = cfg.data
    return make_split(
        d.split_seed, d.train_per_category, d.heldin_per_category, _categories(cfg), demo_pool(cfg), backends(cfg)
    )


def demo_pool(cfg: Config) -> int:
    """Training-side tasks per category the warm start learns from: sft.tasks_per_category, or the
    training split's own."""
    return cfg.sft.tasks_per_category if cfg.sft.enabled and cfg.sft.tasks_per_category else 0


def demo_ids(cfg: Config) -> list[str]:
    """Ids of the tasks demonstrated to the warm start: the training split's, then more of the same side."""
    n = demo_pool(cfg) or cfg.data.train_per_category
    return [i for c in _categories(cfg) for i in first(stream(cfg.data.split_seed, "train", c, backends(cfg)), n)]


def fingerprint(cfg: Config) -> str:
    """A digest of the tasks the warm start is demonstrated, so that one built on another version of the
    practice world (an edit to a domain, to the generator) is not reused."""
    digest = hashlib.sha256()
    for i in demo_ids(cfg):
        digest.update(signature(task(i)).encode())
    return digest.hexdigest()[:16]
