"""Files the package writes: through a temporary name in the same folder, renamed into place when complete, so
that a failed or interrupted write never leaves a truncated file under the final name (nor a temporary). And the
inputs its command-line front-ends read: a fault ends them with SystemExit("FILE: FAULT"), which the front-end
prints as one line."""
import json
import os
import tempfile


def write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_text(path: str) -> str:
    """The UTF-8 text of an input, or SystemExit naming it and its fault."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror or e}") from None
    except ValueError:
        raise SystemExit(f"{path}: not UTF-8 text") from None


def read_json(path: str, key=None):
    """An input's JSON (its member `key` when given), or SystemExit naming it and its fault."""
    try:
        j = json.loads(read_text(path))
    except ValueError as e:
        raise SystemExit(f"{path}: not JSON ({str(e).splitlines()[0][:80]})") from None
    if key is not None and not (isinstance(j, dict) and key in j):
        raise SystemExit(f"{path}: no '{key}' member (not the JSON this reads)")
    return j if key is None else j[key]
