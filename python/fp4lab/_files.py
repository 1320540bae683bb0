"""Files the package writes: through a temporary name in the same folder, renamed into place when complete, so
that a failed or interrupted write never leaves a truncated file under the final name (nor a temporary)."""
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
