"""Links between the user-facing documents resolve: every relative link in README.md and docs/ (results/ included)
names a file or folder that exists, and a link with #anchor names a heading of the Markdown file it points to
(anchors as GitHub makes them from headings). docs/index.md lists every page of docs/. No fp4lab import and no
pytest needed: ctest runs it as a plain script (tests/python/CMakeLists.txt), in well under a second."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = os.path.join(ROOT, "docs")


def documents():
    yield os.path.join(ROOT, "README.md")
    for d, dirs, files in os.walk(DOCS):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(d, f)


def prose(text):
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path):
    """GitHub's heading anchors: lower case, inline markup and punctuation other than - and _ dropped, each space a
    hyphen; a repeated anchor gets -1, -2, ..."""
    seen, out = {}, set()
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", open(path, encoding="utf-8").read(), flags=re.M | re.S)
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def links(path):
    """(target, anchor) of every relative Markdown link and image in the prose of one document."""
    for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)", prose(open(path, encoding="utf-8")
                                                                                           .read())):
        target = m.group(1)
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        yield file, anchor


def test_relative_links_and_anchors_resolve():
    bad = []
    for doc in documents():
        here = os.path.dirname(doc)
        for file, anchor in links(doc):
            full = os.path.normpath(os.path.join(here, file)) if file else doc
            where = f"{os.path.relpath(doc, ROOT)}: ({file}{'#' + anchor if anchor else ''})"
            if not os.path.exists(full):
                bad.append(f"{where}: no such file")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                bad.append(f"{where}: no heading with that anchor in {os.path.relpath(full, ROOT)}")
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def test_index_lists_every_page():
    index = open(os.path.join(DOCS, "index.md"), encoding="utf-8").read()
    listed = {os.path.normpath(os.path.join(DOCS, f)) for f, _ in links(os.path.join(DOCS, "index.md"))}
    pages = {os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md") and f != "index.md"}
    pages |= {os.path.join(DOCS, "results", f) for f in os.listdir(os.path.join(DOCS, "results")) if f.endswith(".md")}
    missing = sorted(os.path.relpath(p, ROOT) for p in pages - listed)
    assert not missing, f"pages docs/index.md does not list: {missing}"
    assert "## User guides" in index and "## Design" in index and "## Results" in index


def test_slugs_follow_github():
    # The anchor rule on headings of the kinds these documents use, spelled as GitHub spells them.
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False, encoding="utf-8") as f:
        f.write("# A `code` title, with punctuation!\n## Speed: the step\n## Speed: the step\n"
                "### 1. E2M1-only vs E1M2-only\n```\n# not a heading\n```\n")
    try:
        assert anchors(f.name) == {"a-code-title-with-punctuation", "speed-the-step", "speed-the-step-1",
                                   "1-e2m1-only-vs-e1m2-only"}
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
    print("README.md and docs/: every relative link and anchor resolves; docs/index.md lists every page")
