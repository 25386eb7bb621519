"""pyinfra @fake hosts for the operation tests: host a answers the commands that hold a given text with given output."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all


def fake_host(responses: dict[str, str]) -> tuple[State, object]:
    """A connected state whose host ``@fake/a`` prints ``responses[text]`` for a command holding ``text``, and the
    host. Host ``@fake/b`` runs nothing: pyinfra stops the whole run when its last host fails."""
    hosts = [("@fake/a", {"fake_delay": 0, "fake_delay_jitter": 0,
                          "fake_responses": {text: {"stdout": output} for text, output in responses.items()}}),
             ("@fake/b", {})]
    state = State(Inventory((hosts, {})), Config())
    connect_all(state)
    return state, state.inventory.get_host("@fake/a")
