"""The study's corpus: the English reStructuredText sources of the Linux kernel documentation, as byte tokens."""
import hashlib
import io
import json
import os
import tarfile
import tempfile
import zlib

SOURCES = "usr/share/doc/{pkg}/html/_sources/"


def _deb_data_tar(path: str) -> tarfile.TarFile:
    """The data.tar.* member of a Debian package (an ar archive), opened with tarfile."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"!<arch>\n":
        raise SystemExit(f"{path}: not a Debian package (no ar header)")
    p = 8
    while p + 60 <= len(blob):
        name = blob[p:p + 16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(blob[p + 48:p + 58].decode("ascii").strip())
        except ValueError:
            raise SystemExit(f"{path}: malformed ar member header at byte {p}") from None
        body = blob[p + 60:p + 60 + size]
        if len(body) != size:
            raise SystemExit(f"{path}: truncated (member {name!r} needs {size} bytes)")
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise SystemExit(f"{path}: zstd-compressed data member; extract it with dpkg-deb -x and pass --root")
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        p += 60 + size + (size & 1)
    raise SystemExit(f"{path}: no data.tar member")


def _is_english_source(rel: str) -> bool:
    return rel.endswith(".rst.txt") and not rel.startswith("translations/")


def _collect(args):
    """(package, version, {relative path: bytes}) from a .deb or an installed tree."""
    files = {}
    if args.deb:
        base = os.path.basename(args.deb)
        pkg, version = (base.split("_") + ["", ""])[:2]
        with _deb_data_tar(args.deb) as tar:
            for m in tar.getmembers():
                name = m.name[2:] if m.name.startswith("./") else m.name
                prefix = SOURCES.format(pkg=pkg)
                if m.isfile() and name.startswith(prefix) and _is_english_source(name[len(prefix):]):
                    files[name[len(prefix):]] = tar.extractfile(m).read()
    else:
        root = args.root
        docs = os.path.join(root, "usr/share/doc")
        pkgs = sorted(d for d in os.listdir(docs) if d.startswith("linux-doc-")) if os.path.isdir(docs) else []
        if not pkgs:
            raise SystemExit(f"{docs}: no linux-doc-<version> package installed (apt-get install linux-doc-6.12, or "
                             "pass --deb)")
        pkg, version = pkgs[-1], "installed"
        src = os.path.join(root, SOURCES.format(pkg=pkg))
        for dp, _, fns in os.walk(src):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), src)
                if _is_english_source(rel):
                    with open(os.path.join(dp, fn), "rb") as f:
                        files[rel] = f.read()
    if not files:
        raise SystemExit(f"{args.deb or args.root}: no English .rst.txt sources found")
    return pkg, version, files


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


def cmd_corpus(args):
    pkg, version, files = _collect(args)
    train, val = [], []
    for rel in sorted(files):
        (val if zlib.crc32(rel.encode()) % 20 == 0 else train).append(files[rel])
    sep = b"\n\n"
    blobs = {"train.bin": sep.join(train), "val.bin": sep.join(val)}
    meta = {"package": pkg, "version": version, "files": {"train": len(train), "val": len(val)},
            "bytes": {k[:-4]: len(v) for k, v in blobs.items()},
            "sha256": {k[:-4]: hashlib.sha256(v).hexdigest() for k, v in blobs.items()},
            "split": "validation = files whose relative path has CRC-32 = 0 mod 20; files joined by a blank line",
            "tokens": "bytes (vocabulary 256)"}
    for k, v in blobs.items():
        write_atomic(os.path.join(args.out, k), v)
    write_atomic(os.path.join(args.out, "corpus.json"), (json.dumps(meta, indent=1) + "\n").encode())
    print(f"{pkg} {version}: {len(train)} train files ({meta['bytes']['train']:,} bytes), {len(val)} validation "
          f"files ({meta['bytes']['val']:,} bytes) -> {args.out}")
