"""How a paid call's result is stored and given back (template-owned: copier-agent-worker).

A result is kept as JSON in its `paid_calls` row. Plain JSON (dicts, lists, strings,
numbers) is stored as it is. A pydantic model, which is what every model SDK returns
(`ChatCompletion`, `Response`, `Message`), is stored as its JSON dump plus the import path
of its class, and a later run of the job gets back the same type: `r.usage` and
`r.choices[0]` work whether the call ran now or was reused from the record.

>>> from_record(to_record({"ok": True}))
{'ok': True}
>>> from_record(to_record({"__model__": "x", "data": 1}))
{'__model__': 'x', 'data': 1}

A model class that cannot be imported by its path (one defined inside a function) is stored
as its plain JSON dump and comes back as a dict.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

# The keys of a stored pydantic model; a plain result with exactly these keys is wrapped too,
# so it never reads back as a model.
_TYPE, _DATA = "__model__", "data"


class Unstorable(TypeError):
    """A result that cannot be written as JSON (an SDK stream, a client object, ...)."""


def to_record(result: Any) -> Any:
    """`result` as JSON-ready data that `from_record` turns back into the same value.

    Raises Unstorable, naming the type, for what JSON cannot hold.
    """
    if _is_model(result):
        cls = type(result)
        data = result.model_dump(mode="json", by_alias=True)
        path = f"{cls.__module__}:{cls.__qualname__}"
        record: Any = {_TYPE: path, _DATA: data} if _resolve(path) is cls else data
    elif isinstance(result, dict) and set(result) == {_TYPE, _DATA}:
        record = {_TYPE: None, _DATA: result}
    else:
        record = result
    try:
        json.dumps(record)
    except (TypeError, ValueError) as exc:
        raise Unstorable(f"the result of type {type(result).__name__} is not JSON: {exc}") from exc
    return record


def from_record(record: Any) -> Any:
    """The value `to_record` stored: a pydantic model comes back as its own class."""
    if not (isinstance(record, dict) and set(record) == {_TYPE, _DATA}):
        return record
    if record[_TYPE] is None:
        return record[_DATA]
    cls = _resolve(str(record[_TYPE]))
    # A class gone since the call was stored (an SDK upgrade): the data, as a dict.
    return record[_DATA] if cls is None else cls.model_validate(record[_DATA])


def _resolve(path: str) -> Any:
    """The object at "module:Qual.Name", or None when it cannot be imported."""
    module, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def _is_model(value: Any) -> bool:
    """Whether `value` is a pydantic (v2) model instance, without importing pydantic here."""
    cls = type(value)
    return callable(getattr(value, "model_dump", None)) and callable(
        getattr(cls, "model_validate", None)
    )
