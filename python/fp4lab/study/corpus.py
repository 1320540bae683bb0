"""A training-data folder: train.bin and val.bin, byte tokens (vocabulary 256), and optionally the corpus.json that
names its corpus. Any text a user gives works; the study's own corpora (CORPORA: the English reStructuredText
page sources of Debian's documentation packages) are extracted by the lab's command (python3 -m fp4lab_lab.study
corpus, outside the installed package), and a run on one of them records its name."""
import os
import re
from typing import NamedTuple

from .._files import DataError, check_output_folder, check_outputs, read_json
from .._files import write_atomic  # noqa: F401  (re-exported: the study's writers use it from here)


class Corpus(NamedTuple):
    package: str  # the Debian package's name (a regular expression)
    folder: str   # its folder under usr/share/doc (a regular expression)
    suffix: str   # the package's name is the folder's and this
    shown: str    # the package as people write it
    what: str


# The corpora the study knows (the lab extracts them). A .deb names its corpus by its package; a run on one
# records its name and what it is.
CORPORA = {
    "linux-doc": Corpus(r"linux-doc-[0-9][0-9.]*", r"linux-doc-[0-9][0-9.]*", "", "linux-doc-<version>",
                        "the Linux kernel documentation"),
    "python-doc": Corpus(r"python3\.[0-9]+-doc", r"python3\.[0-9]+", "-doc", "python3.<minor>-doc",
                         "the Python documentation"),
}
DEFAULT_CORPUS = "linux-doc"  # the corpus of runs whose JSON names none (made before a second corpus existed)


def corpus_of_package(pkg: str):
    """The corpus a Debian package name belongs to, or None."""
    return next((name for name, c in CORPORA.items() if re.fullmatch(c.package, pkg)), None)


def check_folder_outputs(folder: str, names, inputs=()) -> None:
    """The output rules for files `names` to be written into `folder` (made when missing), before any work: the
    folder writable or makeable, and, where it exists, each file an output that overwrites no input."""
    check_output_folder(folder)
    if os.path.isdir(folder):
        check_outputs([os.path.join(folder, n) for n in names], inputs)


def corpus_name(data: str) -> str:
    """The corpus of a training-data folder: the name in the corpus.json the lab's corpus command wrote (one written
    before corpora had names, by its package), or else the folder's own name (text not made by that command)."""
    path = os.path.join(data, "corpus.json")
    own = os.path.basename(os.path.normpath(os.path.abspath(data)))
    if not os.path.exists(path):
        return own
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not a JSON object")
    name = meta.get("corpus")
    if name is not None and (not isinstance(name, str) or not name):
        raise DataError(f"{path}: 'corpus' is not a name: {str(name)[:80]!r}")
    package = meta.get("package")
    return name or (corpus_of_package(package) if isinstance(package, str) else None) or own
