"""The study's corpora, as byte tokens: the English reStructuredText page sources of Sphinx-built documentation from
Debian packages (the Linux kernel's, the default, and Python's), which keep each page's source in html/_sources/."""
import hashlib
import io
import json
import lzma
import os
import re
import tarfile
import zlib
from typing import NamedTuple

from .._files import DataError, UsageError, check_output_folder, check_outputs, read_bytes, read_json
from .._files import write_atomic  # noqa: F401  (re-exported: the study's writers use it from here)


class Corpus(NamedTuple):
    package: str  # the Debian package's name (a regular expression)
    folder: str   # its folder under usr/share/doc (a regular expression)
    suffix: str   # the package's name is the folder's and this
    shown: str    # the package as people write it
    what: str


# The corpora the study knows. A .deb names its corpus by its package; --corpus picks one among the packages
# installed under a root.
CORPORA = {
    "linux-doc": Corpus(r"linux-doc-[0-9][0-9.]*", r"linux-doc-[0-9][0-9.]*", "", "linux-doc-<version>",
                        "the Linux kernel documentation"),
    "python-doc": Corpus(r"python3\.[0-9]+-doc", r"python3\.[0-9]+", "-doc", "python3.<minor>-doc",
                         "the Python documentation"),
}
DEFAULT_CORPUS = "linux-doc"  # the corpus of runs whose JSON names none (made before a second corpus existed)
_SOURCES = re.compile(r"usr/share/doc/([^/]+)/html/_sources/(.+)")


def corpus_of_package(pkg: str):
    """The corpus a Debian package name belongs to, or None."""
    return next((name for name, c in CORPORA.items() if re.fullmatch(c.package, pkg)), None)


def _version_key(name: str):
    """linux-doc-6.9 before linux-doc-6.12, python3.9 before python3.12: numbers compared as numbers."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _deb_data_tar(path: str):
    """(name, tarfile) of the data.tar.* member of a Debian package (an ar archive)."""
    blob = read_bytes(path)
    if blob[:8] != b"!<arch>\n":
        raise DataError(f"{path}: not a Debian package (no ar header)")
    p = 8
    while p + 60 <= len(blob):
        name = blob[p:p + 16].decode("ascii", "replace").strip().rstrip("/")
        field = blob[p + 48:p + 58].strip()
        if not field.isdigit():  # ar sizes are decimal digits; a sign or a space inside is no header
            raise DataError(f"{path}: malformed ar member header at byte {p}")
        size = int(field)
        body = blob[p + 60:p + 60 + size]
        if len(body) != size:
            raise DataError(f"{path}: truncated (member {name!r} needs {size} bytes)")
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise DataError(f"{path}: zstd-compressed data member; extract it with dpkg-deb -x and pass --root")
            mode = {"data.tar": "r:", "data.tar.gz": "r:gz", "data.tar.xz": "r:xz", "data.tar.bz2": "r:bz2"}
            try:
                return name, tarfile.open(fileobj=io.BytesIO(body), mode=mode.get(name, "r:*"))
            except _ARCHIVE_FAULTS as e:
                raise _corrupt(path, name, e) from None
        p += 60 + size + (size & 1)
    raise DataError(f"{path}: no data.tar member")


# What a damaged tar or compressed stream raises while it is read (tarfile reads and inflates lazily).
_ARCHIVE_FAULTS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError)


def _corrupt(path: str, member: str, e: Exception) -> DataError:
    return DataError(f"{path}: corrupt {member} member ({type(e).__name__}: {str(e)[:80]})")


def _is_english_source(rel: str) -> bool:
    return rel.endswith(".rst.txt") and not rel.startswith("translations/")


def _collect(args):
    """(corpus, package, version, {relative path: bytes}, [the files read]) from a .deb or an installed tree."""
    files, read = {}, []
    if args.deb:
        read.append(args.deb)
        base = os.path.basename(args.deb)
        pkg, version = (base.split("_") + ["", ""])[:2]
        corpus = corpus_of_package(pkg)
        member, tar = _deb_data_tar(args.deb)
        with tar:  # a file that is no package at all is named as such first
            if corpus is None:
                raise DataError(f"{args.deb}: package {pkg!r} is none of the corpora's ("
                                + ", ".join(f"{n}: {c.shown}" for n, c in CORPORA.items()) + ")")
            if args.corpus and args.corpus != corpus:
                raise UsageError(f"{args.deb}: a {corpus} package, not {args.corpus} (--corpus)")
            try:
                for m in tar.getmembers():
                    name = m.name[2:] if m.name.startswith("./") else m.name
                    s = _SOURCES.fullmatch(name)
                    if m.isfile() and s and re.fullmatch(CORPORA[corpus].folder, s.group(1)) \
                            and _is_english_source(s.group(2)):
                        files[s.group(2)] = tar.extractfile(m).read()
            except _ARCHIVE_FAULTS as e:
                raise _corrupt(args.deb, member, e) from None
    else:
        corpus = args.corpus or DEFAULT_CORPUS
        c = CORPORA[corpus]
        docs = os.path.join(args.root, "usr/share/doc")
        folders = sorted((d for d in os.listdir(docs) if re.fullmatch(c.folder, d)
                          and os.path.isdir(os.path.join(docs, d, "html/_sources"))),
                         key=_version_key) if os.path.isdir(docs) else []
        if not folders:
            raise DataError(f"{docs}: no {corpus} package installed ({c.what}, {c.shown}: apt-get install it, "
                            "or pass --deb with its .deb from apt-get download)")
        pkg, version = folders[-1] + c.suffix, "installed"  # the newest version installed
        src = os.path.join(docs, folders[-1], "html/_sources")
        for dp, _, fns in os.walk(src):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), src)
                if _is_english_source(rel):
                    read.append(os.path.join(dp, fn))
                    files[rel] = read_bytes(read[-1])
    if not files:
        raise DataError(f"{args.deb or args.root}: no English .rst.txt sources found")
    return corpus, pkg, version, files, read


OUTPUTS = ("train.bin", "val.bin", "corpus.json")  # what `corpus` writes into its folder


def check_folder_outputs(folder: str, names, inputs=()) -> None:
    """The output rules for files `names` to be written into `folder` (made when missing), before any work: the
    folder writable or makeable, and, where it exists, each file an output that overwrites no input."""
    check_output_folder(folder)
    if os.path.isdir(folder):
        check_outputs([os.path.join(folder, n) for n in names], inputs)


def cmd_corpus(args):
    check_folder_outputs(args.out, OUTPUTS, [args.deb] if args.deb else [])  # before anything is read
    corpus, pkg, version, files, read = _collect(args)
    check_folder_outputs(args.out, OUTPUTS, read)  # never a source it read (a --root tree holding the folder)
    train, val = [], []
    for rel in sorted(files):
        (val if zlib.crc32(rel.encode()) % 20 == 0 else train).append(files[rel])
    sep = b"\n\n"
    blobs = {"train.bin": sep.join(train), "val.bin": sep.join(val)}
    meta = {"corpus": corpus, "package": pkg, "version": version, "files": {"train": len(train), "val": len(val)},
            "bytes": {k[:-4]: len(v) for k, v in blobs.items()},
            "sha256": {k[:-4]: hashlib.sha256(v).hexdigest() for k, v in blobs.items()},
            "split": "validation = files whose relative path has CRC-32 = 0 mod 20; files joined by a blank line",
            "tokens": "bytes (vocabulary 256)"}
    blobs["corpus.json"] = (json.dumps(meta, indent=1) + "\n").encode()
    for k in OUTPUTS:
        write_atomic(os.path.join(args.out, k), blobs[k], read, make_dirs=True)
    print(f"{corpus}: {pkg} {version}: {len(train)} train files ({meta['bytes']['train']:,} bytes), {len(val)} "
          f"validation files ({meta['bytes']['val']:,} bytes) -> {args.out}")


def corpus_name(data: str) -> str:
    """The corpus of a training-data folder: the name in the corpus.json `fp4lab-train corpus` wrote (one written
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
