"""JSON without the json module (which imports re, and re enum): the probe's options, this tool's state files,
pip's direct_url.json and the probe's output. The probe runs on every host on every run.
"""

from __future__ import annotations



_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_JSON_CONSTANTS = (("true", True), ("false", False), ("null", None))
_JSON_NUMBER = frozenset("+-0123456789.eE")
_JSON_SPACE = frozenset(" \t\n\r")


def json_loads(text: str):
    """The value of a JSON document, as ``json.loads`` gives it; ValueError for most texts that are not one (a
    control character inside a string is let through)."""
    try:
        value, end = _json_value(text, _json_skip(text, 0))
    except IndexError:
        raise ValueError("not JSON: the text ends inside a value") from None
    except KeyError as error:
        raise ValueError(f"not JSON: unknown escape \\{error.args[0]}") from None
    except ValueError as error:
        raise ValueError(f"not JSON: {error}") from None
    if _json_skip(text, end) != len(text):
        raise ValueError(f"not JSON: extra data at character {end}")
    return value


def _json_skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _JSON_SPACE:
        index += 1
    return index


def _json_value(text: str, index: int) -> tuple[object, int]:
    char = text[index]
    if char == '"':
        return _json_string(text, index + 1)
    if char in "{[":
        closing, items = ("}", {}) if char == "{" else ("]", [])
        index = _json_skip(text, index + 1)
        while text[index] != closing:
            if isinstance(items, dict):
                if text[index] != '"':
                    raise ValueError(f"expected a name at character {index}")
                key, index = _json_string(text, index + 1)
                index = _json_skip(text, index)
                if text[index] != ":":
                    raise ValueError(f"expected ':' at character {index}")
                items[key], index = _json_value(text, _json_skip(text, index + 1))
            else:
                value, index = _json_value(text, index)
                items.append(value)
            index = _json_skip(text, index)
            if text[index] == ",":
                index = _json_skip(text, index + 1)
            elif text[index] != closing:
                raise ValueError(f"expected ',' or {closing!r} at character {index}")
        return items, index + 1
    for word, constant in _JSON_CONSTANTS:
        if text.startswith(word, index):
            return constant, index + len(word)
    end = index
    while end < len(text) and text[end] in _JSON_NUMBER:
        end += 1
    token = text[index:end]
    if not token:
        raise ValueError(f"unexpected {char!r} at character {index}")
    return (float(token) if "." in token or "e" in token or "E" in token else int(token)), end


def _json_string(text: str, index: int) -> tuple[str, int]:
    """The string starting after its opening quote at ``index``, and the index after its closing quote."""
    parts = []
    while True:
        end = text.find('"', index)
        if end < 0:
            raise ValueError(f"unterminated string from character {index - 1}")
        backslash = text.find("\\", index, end)
        if backslash < 0:
            parts.append(text[index:end])
            return "".join(parts), end + 1
        parts.append(text[index:backslash])
        code = text[backslash + 1]
        if code != "u":
            parts.append(_JSON_ESCAPES[code])
            index = backslash + 2
            continue
        point, index = int(text[backslash + 2:backslash + 6], 16), backslash + 6
        if 0xD800 <= point < 0xDC00 and text.startswith("\\u", index):  # a surrogate pair is one character
            low = int(text[index + 2:index + 6], 16)
            if 0xDC00 <= low < 0xE000:
                point, index = 0x10000 + ((point - 0xD800) << 10) + (low - 0xDC00), index + 6
        parts.append(chr(point))


# Escaped as json.dumps escapes them (ensure_ascii): quote, backslash, control characters, DEL and all beyond ASCII,
# so that the output survives any locale's stdout.
_JSON_STRING_ESCAPES = {**{code: f"\\u{code:04x}" for code in (*range(0x20), 0x7F)}, ord('"'): '\\"', ord("\\"): "\\\\",
                        ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b", ord("\f"): "\\f"}


def _json_string_text(value: str) -> str:
    value = value.translate(_JSON_STRING_ESCAPES)
    if not value.isascii():
        value = "".join(char if ord(char) < 0x80 else f"\\u{ord(char):04x}" if ord(char) < 0x10000 else
                        "\\u{:04x}\\u{:04x}".format(0xD7C0 + (ord(char) >> 10), 0xDC00 + (ord(char) & 0x3FF))
                        for char in value)
    return '"' + value + '"'


def json_dumps(value) -> str:
    """``value`` (dicts with string keys, lists, tuples, strings, numbers, booleans, None) as ``json.dumps(value,
    sort_keys=True, separators=(",", ":"))`` writes it."""
    if isinstance(value, str):
        return _json_string_text(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value} has no JSON form")
        return repr(value)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"keys must be strings, not {sorted({type(key).__name__ for key in value})}")
        return "{" + ",".join(f"{_json_string_text(key)}:{json_dumps(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_dumps(item) for item in value) + "]"
    raise TypeError(f"{type(value).__name__} has no JSON form")
