"""Write examples/kitchen/tasks.jsonl: the kitchen world's tasks, drawn from a seed.

    python examples/kitchen/make_tasks.py [--seed 0] [--per-category 30] [--heldin 10]

Each task is a short session with the oven or the pantry (now and then both): 2-3 requests of the four
categories the kit knows. The oven hides a precondition (a temperature needs the oven switched on, and a
dish a temperature) and an enum whose values the user does not spell as the tool does ("convection" for
fan, "broil" for grill). A miss_param request leaves a value out (the right move: ask); a miss_func one
needs a tool that is not offered yet (the right move: say so; the next turn reveals it); long_context
tasks start with a large pantry the user asks about. The last `--heldin` tasks of each category are held
in; a held-in task equal to a training task is drawn again.
"""

import argparse
import json
import random
from pathlib import Path

DISHES = ["bread", "pizza", "cake", "pie", "muffins", "cookies", "lasagna", "potatoes"]
ITEMS = ["eggs", "flour", "sugar", "butter", "milk", "apples", "cheese", "rice", "salt", "honey", "lemons", "oats"]
TEMPERATURES = [160, 180, 200, 220]
MINUTES = [10, 20, 30, 40]
MODES = {"bake": ["bake", "baking"], "grill": ["grill", "broil"], "fan": ["fan", "convection"]}
"""Each mode and the words a user says for it (the second is not the tool's value)."""


def call(name: str, **arguments) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def tool(call_text: str) -> str:
    return call_text.split("(")[0]


class Kitchen:
    """The state a session starts from and its requests: each returns (text, calls, ask, answer) or None when
    the state does not allow it; `ask` leaves a value out and `answer` gives it (empty: no miss_param form)."""

    def __init__(self, rng: random.Random, large: bool):
        self.rng = rng
        self.power = rng.choice(["off", "on"])
        self.temperature = rng.choice(TEMPERATURES) if self.power == "on" else 0
        self.mode = "bake"
        self.stock = {i: rng.randint(0, 6) for i in rng.sample(ITEMS, 10 if large else 3)}
        self.initial = {
            "Oven": {"power": self.power, "temperature": self.temperature},
            "Pantry": {"stock": dict(self.stock), "shopping_list": []},
        }

    def _heat(self, celsius: int) -> list[str]:
        """The calls that get the oven to a temperature: switch it on first if it is off."""
        calls = [call("switch_on")] if self.power == "off" else []
        self.power = "on"
        if self.temperature != celsius:
            calls.append(call("set_temperature", celsius=celsius))
            self.temperature = celsius
        return calls

    def oven_heat(self):
        t = self.rng.choice([t for t in TEMPERATURES if t != self.temperature])
        text = self.rng.choice(["Heat the oven to {} degrees.", "Set the oven to {} degrees."]).format(t)
        return text, self._heat(t), "Set the oven temperature, please.", f"{t} degrees."

    def oven_mode(self):
        mode = self.rng.choice([m for m in MODES if m != self.mode])
        self.mode = mode
        text = self.rng.choice(["Switch the oven to {} mode.", "Use the {} setting."]).format(
            self.rng.choice(MODES[mode])
        )
        return text, [call("set_mode", mode=mode)], "", ""

    def oven_bake(self):
        dish, t, m = self.rng.choice(DISHES), self.rng.choice(TEMPERATURES), self.rng.choice(MINUTES)
        text = f"Bake {dish} at {t} degrees for {m} minutes."
        return (
            text,
            self._heat(t) + [call("bake", dish=dish, minutes=m)],
            f"Bake {dish} at {t} degrees.",
            f"For {m} minutes.",
        )

    def oven_off(self):
        if self.power == "off":
            return None
        self.power, self.temperature = "off", 0
        return self.rng.choice(["Turn the oven off.", "Switch off the oven."]), [call("switch_off")], "", ""

    def oven_status(self):
        return self.rng.choice(["Is the oven on?", "What is the oven doing?"]), [call("status")], "", ""

    def pantry_check(self):
        item = self.rng.choice(sorted(self.stock))
        return f"How many {item} do I have?", [call("check_stock", item=item)], "", ""

    def pantry_use(self):
        options = [i for i, n in self.stock.items() if n >= 1]
        if not options:
            return None
        item = self.rng.choice(sorted(options))
        n = self.rng.randint(1, self.stock[item])
        self.stock[item] -= n
        calls = [call("use_item", item=item, count=n)]
        return f"Take {n} {item} out of the pantry.", calls, f"Take some {item} out of the pantry.", f"{n} of them."

    def pantry_shop(self):
        item = self.rng.choice(ITEMS)
        text = self.rng.choice(["Add {} to my shopping list.", "Put {} on the shopping list."]).format(item)
        return text, [call("add_to_shopping_list", item=item)], "Add something to my shopping list.", f"It is {item}."

    def listing(self):
        return self.rng.choice(["What is in my pantry?", "List my pantry."]), [call("list_pantry")], "", ""


OVEN = ["oven_heat", "oven_mode", "oven_bake", "oven_off", "oven_status"]
PANTRY = ["pantry_check", "pantry_use", "pantry_shop"]


def draw(category: str, rng: random.Random, task_id: str, side: str) -> dict:
    """One task of a category (drawn again until the category's phenomenon fits)."""
    while True:
        kitchen = Kitchen(rng, large=category == "long_context")
        pool = rng.choice([OVEN, PANTRY, OVEN + PANTRY]) if category != "long_context" else PANTRY
        names = rng.sample(pool, min(len(pool), 2 if category != "base" else rng.randint(2, 3)))
        requests = [kitchen.listing()] if category == "long_context" else []
        requests += [r for r in (getattr(kitchen, n)() for n in names) if r is not None]
        if category == "miss_param":
            options = [i for i, r in enumerate(requests) if r[2]]
        elif category == "miss_func":  # a request whose last tool no earlier request uses
            options = [
                i for i, r in enumerate(requests) if tool(r[1][-1]) not in {tool(c) for q in requests[:i] for c in q[1]}
            ]
        else:
            options = [None]
        if len(requests) >= 2 and options:
            break
    special = rng.choice(options)
    question, truth, missed = [], [], {}
    for i, (text, calls, ask, answer) in enumerate(requests):
        if i == special and category == "miss_param":
            question += [[{"role": "user", "content": ask}], [{"role": "user", "content": answer}]]
            truth += [[], calls]
        elif i == special:  # miss_func: no call now, the next turn reveals the tool (no user text: the kit's)
            question += [[{"role": "user", "content": text}], []]
            truth += [[], calls]
            missed[str(len(truth) - 1)] = [tool(calls[-1])]
        else:
            question.append([{"role": "user", "content": text}])
            truth.append(calls)
    used = {tool(c) for calls in truth for c in calls}
    classes = [c for c, tools in (("Oven", OVEN_TOOLS), ("Pantry", PANTRY_TOOLS)) if used & tools]
    task = {"id": task_id, "split": side, "category": category, "question": question}
    task |= {"initial_config": {c: kitchen.initial[c] for c in classes}, "involved_classes": classes}
    task |= {"ground_truth": truth} | ({"missed_function": missed} if missed else {})
    return task


OVEN_TOOLS = {"switch_on", "switch_off", "set_mode", "set_temperature", "bake", "status"}
PANTRY_TOOLS = {"check_stock", "use_item", "add_to_shopping_list", "list_pantry"}
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-category", type=int, default=30)
    parser.add_argument("--heldin", type=int, default=10, help="held-in tasks per category (the last ones)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "tasks.jsonl"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows, seen = [], set()
    for category in CATEGORIES:
        for n in range(args.per_category):
            side = "heldin" if n >= args.per_category - args.heldin else "train"
            while True:  # a held-in task never equals a training task
                task = draw(category, rng, f"kitchen_{category}_{n}", side)
                key = json.dumps([task["question"], task["ground_truth"], task["initial_config"]], sort_keys=True)
                if side == "train" or key not in seen:
                    break
            seen.add(key)
            rows.append(json.dumps(task))
    Path(args.out).write_text("\n".join(rows) + "\n")
    print(f"wrote {len(rows)} tasks to {args.out}")


if __name__ == "__main__":
    main()
