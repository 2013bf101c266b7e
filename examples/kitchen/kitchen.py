"""The kitchen: an example tool world of two back ends (docs/your_tools.md).

Each public method is a tool; its schema comes from the signature and the docstring's "Args:" section.
`Oven` reads a task's initial_config with `_load_scenario`, as BFCL's classes do; `Pantry` has none, so the
kit sets each key of its state as the public attribute of that name. Errors come back as {"error": ...},
as BFCL's back ends report them; the public attributes are the state BFCL's checker compares.
"""

from typing import Literal


class Oven:
    """An oven: switched on or off, a mode, a temperature, and the dishes baked in it."""

    def __init__(self):
        self.power = "off"
        self.mode = "bake"
        self.temperature = 0
        self.baked: list[dict] = []

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        self.power = scenario.get("power", "off")
        self.mode = scenario.get("mode", "bake")
        self.temperature = scenario.get("temperature", 0)

    def switch_on(self) -> dict:
        """Switch the oven on."""
        if self.power == "on":
            return {"error": "the oven is already on"}
        self.power = "on"
        return {"power": "on"}

    def switch_off(self) -> dict:
        """Switch the oven off; it cools down to 0 degrees."""
        if self.power == "off":
            return {"error": "the oven is already off"}
        self.power, self.temperature = "off", 0
        return {"power": "off"}

    def set_mode(self, mode: Literal["bake", "grill", "fan"]) -> dict:
        """Set the heating mode.

        Args:
            mode (str): The heating mode.
        """
        if mode not in ("bake", "grill", "fan"):
            return {"error": f"unknown mode {mode!r}"}
        self.mode = mode
        return {"mode": mode}

    def set_temperature(self, celsius: int) -> dict:
        """Set the temperature. The oven must be on.

        Args:
            celsius (int): The temperature in degrees Celsius.
        """
        if self.power != "on":
            return {"error": "the oven is off: switch it on first"}
        self.temperature = celsius
        return {"temperature": celsius}

    def bake(self, dish: str, minutes: int) -> dict:
        """Bake a dish. The oven must be on and heated.

        Args:
            dish (str): What to bake.
            minutes (int): How long to bake it, in minutes.
        """
        if self.power != "on" or not self.temperature:
            return {"error": "the oven is not heated: switch it on and set a temperature first"}
        self.baked.append({"dish": dish, "minutes": minutes, "celsius": self.temperature, "mode": self.mode})
        return {"baking": dish, "ready_in_minutes": minutes}

    def status(self) -> dict:
        """The oven's power, mode and temperature."""
        return {"power": self.power, "mode": self.mode, "temperature": self.temperature}


class Pantry:
    """A pantry: how many of each item are in stock, and a shopping list."""

    def __init__(self):
        self.stock: dict[str, int] = {}
        self.shopping_list: list[str] = []

    def check_stock(self, item: str) -> dict:
        """How many of an item are in the pantry.

        Args:
            item (str): The item, e.g. eggs.
        """
        return {"item": item, "count": self.stock.get(item, 0)}

    def use_item(self, item: str, count: int) -> dict:
        """Take some of an item out of the pantry.

        Args:
            item (str): The item.
            count (int): How many to take.
        """
        if self.stock.get(item, 0) < count:
            return {"error": f"only {self.stock.get(item, 0)} {item} in the pantry"}
        self.stock[item] -= count
        return {"item": item, "left": self.stock[item]}

    def add_to_shopping_list(self, item: str) -> dict:
        """Add an item to the shopping list.

        Args:
            item (str): The item to buy.
        """
        self.shopping_list.append(item)
        return {"shopping_list": list(self.shopping_list)}

    def list_pantry(self) -> dict:
        """Everything in the pantry, with counts."""
        return dict(sorted(self.stock.items()))
