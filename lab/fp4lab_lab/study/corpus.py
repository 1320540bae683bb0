"""The study's corpora from Debian packages: the English reStructuredText page sources of Sphinx-built
documentation (the Linux kernel's, the default, and Python's), which keep each page's source in html/_sources/,
read from a .deb (an `ar` archive holding data.tar.*) or an installed tree, into a training-data folder
(train.bin, val.bin, corpus.json) that fp4lab-train reads."""
import hashlib
import io
import json
import lzma
import os
import re
import tarfile
import zlib

from fp4lab._files import DataError, UsageError, read_bytes, write_atomic
from fp4lab.study.corpus import CORPORA, DEFAULT_CORPUS, check_folder_outputs, corpus_of_package

_SOURCES = re.compile(r"usr/share/doc/([^/]+)/html/_sources/(.+)")


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
