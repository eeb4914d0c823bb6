"""Reading and writing one JSON record file: atomically, and with errors that name the file
and the first bad field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class RunFolderError(Exception):
    """A folder or file that is not a readable latlab record."""


def write_json(path: Path, record: BaseModel) -> None:
    """Write `record` to `path` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(record.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def read_json(path: Path, model: type[M]) -> M:
    """`path` read as `model`; `RunFolderError` names the file and the first bad field."""
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as e:
        raise RunFolderError(f"{path}: unreadable: {e.strerror}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RunFolderError(f"{path}: not a latlab {model.__name__}: "
                             f"{where + ': ' if where else ''}{first['msg']}") from None
