"""fp4lab.study (`fp4lab-train`) and the lab's study command (python3 -m fp4lab_lab.study, lab/): the corpus
extraction from a Debian package, a training run's reproducibility and JSON, the report's tables, and
docs/results/training.md generated from docs/results/training.json (not typed); the bundled doc-lm trace and its committed
analysis."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zlib

import pytest
import torch

from fp4lab import _core
from fp4lab import study as st

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
RUN_KEYS = {"name", "model", "params", "recipe", "gemm_mode", "seed", "steps", "train_loss", "val_steps", "val_loss",
            "tokens_per_s"}


def py(*args, module="fp4lab.study", **kw):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, **kw)


def lab(*args, **kw):
    """The lab's study command (corpus, name, and docs/ as the default outputs): lab/ is on PYTHONPATH."""
    return py(*args, module="fp4lab_lab.study", **kw)


def bench_train_step():
    """scripts/bench_train_step.py as a module (a developer tool, not part of the package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_train_step",
                                                  os.path.join(ROOT, "scripts", "bench_train_step.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FILES = {  # relative to html/_sources
    "admin-guide/a.rst.txt": b"The kernel boots.\n",
    "core-api/b.rst.txt": b"Memory barriers order accesses.\n",
    "driver-api/c.rst.txt": b"A driver binds to a device.\n",
    "filesystems/d.rst.txt": b"Files have inodes.\n",
    "process/e.rst.txt": b"Patches go to the list.\n",
    "translations/zh_CN/f.rst.txt": "内核".encode(),
    "admin-guide/g.html": b"<p>not a source</p>",
}


def make_tree(root, pkg="linux-doc-9.9"):
    base = os.path.join(root, "usr/share/doc", pkg, "html/_sources")
    for rel, data in FILES.items():
        p = os.path.join(base, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)


def make_deb(tmp_path, package, version, doc_folder):
    """make_tree's files as a Debian package built by dpkg-deb (xz data member, as Debian's own)."""
    pkg = tmp_path / f"pkg-{package}"
    make_tree(pkg, pkg=doc_folder)
    os.makedirs(pkg / "DEBIAN")
    (pkg / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                                           "Maintainer: t <t@example.org>\nDescription: test\n")
    deb = tmp_path / f"{package}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "-Zxz", "--build", str(pkg), str(deb)], check=True, capture_output=True)
    return deb


def extract(out, *args):
    """`python3 -m fp4lab_lab.study corpus ARGS OUT`, which must succeed and write make_tree's English files, split."""
    r = lab("corpus", *args, str(out))
    assert r.returncode == 0, r.stderr
    check_corpus(out)


def expected_split():
    eng = sorted(r for r in FILES if r.endswith(".rst.txt") and not r.startswith("translations/"))
    val = [r for r in eng if zlib.crc32(r.encode()) % 20 == 0]
    train = [r for r in eng if r not in val]
    return b"\n\n".join(FILES[r] for r in train), b"\n\n".join(FILES[r] for r in val), len(train), len(val)


def check_corpus(out):
    train, val, nt, nv = expected_split()
    assert open(os.path.join(out, "train.bin"), "rb").read() == train
    assert open(os.path.join(out, "val.bin"), "rb").read() == val
    meta = json.load(open(os.path.join(out, "corpus.json")))
    assert meta["files"] == {"train": nt, "val": nv}
    assert meta["sha256"]["train"] == hashlib.sha256(train).hexdigest()


def test_corpus_from_installed_tree_and_from_deb(tmp_path):
    make_tree(tmp_path / "root")
    extract(tmp_path / "a", "--root", str(tmp_path / "root"))
    # The same tree as a Debian package.
    deb = make_deb(tmp_path, "linux-doc-9.9", "9.9-1", "linux-doc-9.9")
    extract(tmp_path / "b", "--deb", str(deb))
    assert json.load(open(tmp_path / "b" / "corpus.json"))["version"] == "9.9-1"
    # Faults name the file.
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"not an archive")
    r = lab("corpus", "--deb", str(bad), str(tmp_path / "c"))
    assert r.returncode != 0 and str(bad) in r.stderr and "not a Debian package" in r.stderr
    r = lab("corpus", "--root", str(tmp_path / "nothing"), str(tmp_path / "c"))
    assert r.returncode != 0 and "no linux-doc" in r.stderr


def test_second_corpus_python_doc(tmp_path):
    # The Python documentation's package keeps its pages under usr/share/doc/python3.<minor>/html/_sources, as
    # Sphinx writes them: the same files give the same split, and corpus.json names the corpus.
    make_tree(tmp_path / "root", pkg="python3.99")
    make_tree(tmp_path / "root", pkg="python3.100")  # the newest version is taken: 3.100 after 3.99
    make_tree(tmp_path / "root", pkg="linux-doc-9.9")
    extract(tmp_path / "a", "--root", str(tmp_path / "root"), "--corpus", "python-doc")
    meta = json.load(open(tmp_path / "a" / "corpus.json"))
    assert meta["corpus"] == "python-doc" and meta["package"] == "python3.100-doc"
    assert st.corpus_name(str(tmp_path / "a")) == "python-doc"
    r = lab("corpus", "--root", str(tmp_path / "root"), str(tmp_path / "l"))  # the default: linux-doc
    assert r.returncode == 0 and json.load(open(tmp_path / "l" / "corpus.json"))["corpus"] == "linux-doc"
    deb = make_deb(tmp_path, "python3.99-doc", "3.99.1-1", "python3.99")
    extract(tmp_path / "b", "--deb", str(deb))
    assert json.load(open(tmp_path / "b" / "corpus.json"))["corpus"] == "python-doc"
    # A package of no corpus, and a corpus not installed, are refused naming the file or folder.
    other = tmp_path / "perl-doc_5.36_all.deb"
    shutil.copy(deb, other)
    r = lab("corpus", "--deb", str(other), str(tmp_path / "c"))
    assert r.returncode != 0 and str(other) in r.stderr and "none of the corpora" in r.stderr
    r = lab("corpus", "--root", str(tmp_path / "nothing"), "--corpus", "python-doc", str(tmp_path / "c"))
    assert r.returncode != 0 and "no python-doc package installed" in r.stderr
    # A run names its corpus in its JSON and, for a corpus other than the first, in its name; a corpus.json written
    # before corpora had names is read by its package.
    assert lab("name", "--data", str(tmp_path / "b"), "small:ufp4:exact:3:6000").stdout.split() == [
        "small-ufp4-exact-s3-6000-python-doc"]
    assert lab("name", "--data", str(tmp_path / "l"), "small:ufp4:exact:3:6000").stdout.split() == [
        "small-ufp4-exact-s3-6000"]
    old = json.load(open(tmp_path / "l" / "corpus.json"))
    del old["corpus"]
    (tmp_path / "l" / "corpus.json").write_text(json.dumps(old))
    assert st.corpus_name(str(tmp_path / "l")) == "linux-doc"
    # --corpus must agree with the package; a malformed corpus.json is a one-line error naming it.
    r = lab("corpus", "--deb", str(deb), "--corpus", "linux-doc", str(tmp_path / "d"))
    assert r.returncode != 0 and str(deb) in r.stderr and "a python-doc package, not linux-doc" in r.stderr
    for bad in ("[1, 2]", '{"corpus": 5}', "{"):
        (tmp_path / "l" / "corpus.json").write_text(bad)
        r = lab("name", "--data", str(tmp_path / "l"), "small:ufp4:exact:3:6000")
        assert r.returncode != 0 and str(tmp_path / "l" / "corpus.json") in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real English text: this repository's docs for training, its README for validation."""
    d = tmp_path_factory.mktemp("data")
    docs = sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    (d / "train.bin").write_bytes(b"\n\n".join(open(p, "rb").read() for p in docs))
    (d / "val.bin").write_bytes(open(os.path.join(ROOT, "README.md"), "rb").read()[:6000])
    return d


def train(data, out, recipe, seed=0, steps=12, *extra):
    r = py("train", "--data", str(data), "--size", "test", "--recipe", recipe, "--steps", str(steps),
           "--eval-every", "6", "--eval-windows", "8", "--log-every", "6", "--seed", str(seed), "--device", "cpu",
           "--out", str(out), *extra, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return json.load(open(out))


def test_training_runs_reproducible_with_the_documented_json(data, tmp_path):
    a = train(data, tmp_path / "a.json", "ufp4")
    b = train(data, tmp_path / "b.json", "ufp4")
    assert RUN_KEYS <= set(a)
    assert a["corpus"] == os.path.basename(str(data))  # text not made by `corpus`: named by its folder
    assert a["train_loss"] == b["train_loss"] and a["val_loss"] == b["val_loss"]  # bit for bit on the CPU
    assert a["steps"] == list(range(1, 13)) and a["val_steps"] == [6, 12] and len(a["train_loss"]) == 12
    assert a["recipe"] == "ufp4" and a["gemm_mode"] == "exact" and a["diverged"] is None
    # The default run name is the one scripts/train_study.sh gets from `name` for the same spec and data; text not
    # made by `corpus` is a corpus of its own, named by its folder, and the runs on it say so.
    here = os.path.basename(str(data))
    r = lab("name", "--data", str(data), "test:ufp4:exact:0:12", "test:bf16:exact:1:6000:--capture-steps 2,3")
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == [a["name"], f"test-bf16-bf16-s1-6000-{here}"]
    assert a["name"] == f"test-ufp4-exact-s0-12-{here}"
    assert lab("name", "test:ufp4:exact:0:12").stdout.strip() == "test-ufp4-exact-s0-12"  # no data: the first corpus
    assert lab("name", "test:ufp4:exact").returncode == 2
    assert a["train_loss"][-1] < a["train_loss"][0]
    # --deterministic runs (every op with a fixed-order algorithm) and is recorded; on the CPU the defaults are
    # already deterministic, so the losses are the same bits.
    d = train(data, tmp_path / "d.json", "ufp4", 0, 12, "--deterministic")
    assert d["deterministic"] is True and a["deterministic"] is False
    assert d["train_loss"] == a["train_loss"] and d["val_loss"] == a["val_loss"]
    # --sr-draw philox1, the original SR draw (docs/spec.md §4): recorded, named, and only the SR operands' bits
    # differ, so the first forward (no SR) is the same and the training losses then part.
    o = train(data, tmp_path / "o.json", "ufp4", 0, 12, "--sr-draw", "philox1")
    assert o["sr_draw"] == "philox1" and a["sr_draw"] == "philox4"
    assert o["name"] == f"test-ufp4-exact-s0-12-{here}-philox1"
    assert o["train_loss"][0] == a["train_loss"][0] and o["train_loss"] != a["train_loss"]
    bf = train(data, tmp_path / "bf.json", "bf16")
    # Same initialisation and batches: the first forward differs only by the recipe's quantisation.
    assert abs(bf["train_loss"][0] - a["train_loss"][0]) < 0.05 and bf["train_loss"] != a["train_loss"]
    s1 = train(data, tmp_path / "s1.json", "bf16", seed=1)
    assert s1["train_loss"][0] != bf["train_loss"][0]
    # An existing output is not overwritten.
    r = py("train", "--data", str(data), "--size", "test", "--steps", "10", "--device", "cpu",
           "--out", str(tmp_path / "a.json"))
    assert r.returncode != 0 and "exists" in r.stderr
    assert json.load(open(tmp_path / "a.json")) == a

    doc = tmp_path / "t.md"
    doc.write_text("<!-- training status: fp4lab-train report -->\n<!-- end of training status: "
                   "fp4lab-train report -->\n<!-- training tables: fp4lab-train report -->\n"
                   "<!-- end of training tables: fp4lab-train report -->\n")
    # A BF16 run of another length is a study of its own, never the reference of the 12-step runs.
    short = train(data, tmp_path / "short.json", "bf16", steps=10)
    assert short["name"] != bf["name"]
    r = py("report", str(tmp_path / "a.json"), str(tmp_path / "bf.json"), str(tmp_path / "s1.json"),
           str(tmp_path / "short.json"), "--json", str(tmp_path / "training.json"), "--doc", str(doc),
           "--figures", str(tmp_path / "fig"))
    assert r.returncode == 0, r.stderr
    merged = json.load(open(tmp_path / "training.json"))["runs"]
    assert sorted(x["name"] for x in merged) == sorted([a["name"], bf["name"], s1["name"], short["name"]])
    text = doc.read_text()
    rel = 100 * (a["val_loss"][-1] - bf["val_loss"][-1]) / bf["val_loss"][-1]
    assert f"| `ufp4` | exact | 1 | {rel:+.2f} ({rel:+.2f})" in text
    assert "BF16 seed-to-seed spread (2 seeds" in text and "e2m1-ref" in text
    assert text.count("### test: ") == 2 and " 10 steps (" in text and " 12 steps (" in text
    assert ("- **test, 10 steps: ufp4 vs e2m1-ref** — not both run with a common seed (of the two, run: neither)"
            in text)
    # No runs given: the results file is kept, or with --merge its report redone from it.
    before = (tmp_path / "training.json").read_bytes()
    r = py("report", "--json", str(tmp_path / "training.json"), "--doc", "", "--figures", "")
    assert r.returncode != 0 and "no runs" in r.stderr and (tmp_path / "training.json").read_bytes() == before
    r = py("report", "--merge", "--json", str(tmp_path / "training.json"), "--doc", str(doc), "--figures", "")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "training.json").read_bytes() == before and doc.read_text() == text
    assert os.path.getsize(tmp_path / "fig_test_12.png") > 10000 and os.path.getsize(tmp_path / "fig_test_10.png")
    r = py("report", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(tmp_path / "x.json"),
           "--doc", "", "--figures", "")
    assert r.returncode != 0 and "given twice" in r.stderr


def test_a_run_stopped_at_its_time_limit_resumes_bit_for_bit(data, tmp_path):
    whole = train(data, tmp_path / "whole.json", "ufp4", steps=12)
    ck, out = tmp_path / "ck.pt", tmp_path / "parts.json"
    args = ["train", "--data", str(data), "--size", "test", "--recipe", "ufp4", "--steps", "12", "--eval-every", "6",
            "--eval-windows", "8", "--log-every", "6", "--device", "cpu", "--out", str(out), "--checkpoint", str(ck),
            "--time-limit", "1e-9"]  # every invocation stops after one step
    pauses = 0
    while True:
        # The first part shares the GPU with two other runs, the later ones with none: the run records the most.
        r = py(*args, *(["--concurrent", "3"] if pauses == 0 else []), env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode != st.EXIT_CONTINUE:
            break
        pauses += 1
        assert ck.exists() and not out.exists()
    assert r.returncode == 0, r.stderr
    assert pauses == 11 and not ck.exists()
    parts = json.load(open(out))
    for k in ("train_loss", "val_steps", "val_loss", "steps"):
        assert parts[k] == whole[k], k
    assert parts["concurrent_runs"] == 3 and whole["concurrent_runs"] == 1
    # --stop-at N: the same, stopping after step N (exit 75), which needs --checkpoint and a step inside the run.
    out.unlink()
    r = py(*args[:-2], "--stop-at", "5", env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == st.EXIT_CONTINUE and "stopped after step 5" in r.stdout and not out.exists()
    r = py(*args[:-2], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "resumed at step 5" in r.stdout and not ck.exists()
    for k in ("train_loss", "val_steps", "val_loss", "steps"):
        assert json.load(open(out))[k] == whole[k], k
    for bad in (["--stop-at", "12"], ["--stop-at", "0"]):
        r = py(*args[:-2], *bad)
        assert r.returncode == 2 and "--stop-at needs --checkpoint and a step between 1 and --steps" in r.stderr
    r = py(*[a for a in args[:-4]], "--stop-at", "3")
    assert r.returncode == 2 and "--stop-at needs --checkpoint" in r.stderr
    # A checkpoint of another run is refused, naming the file.
    out.unlink()
    r = py(*args)
    assert r.returncode == st.EXIT_CONTINUE
    r = py(*[a if a != "ufp4" else "nvfp4" for a in args[:-4]], "--out", str(tmp_path / "o.json"), "--checkpoint",
           str(ck))
    assert r.returncode != 0 and str(ck) in r.stderr and "another run" in r.stderr
    # ... and so is one under the other SR draw; a checkpoint written before the draw existed (no sr_draw in its
    # key) was made under philox1 and resumes under that draw alone.
    r = py(*args[:-4], "--sr-draw", "philox1", "--out", str(tmp_path / "o.json"), "--checkpoint", str(ck))
    assert r.returncode != 0 and str(ck) in r.stderr and "another run" in r.stderr
    import torch
    state = torch.load(ck, weights_only=True)
    del state["key"]["sr_draw"]
    torch.save(state, ck)
    r = py(*args[:-4], "--out", str(tmp_path / "o.json"), "--checkpoint", str(ck))
    assert r.returncode != 0 and str(ck) in r.stderr and "another run" in r.stderr
    r = py(*args[:-4], "--sr-draw", "philox1", "--out", str(tmp_path / "o.json"), "--checkpoint", str(ck),
           "--stop-at", "2", env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == st.EXIT_CONTINUE and "resumed at step 1" in r.stdout, r.stdout + r.stderr
    # ... and so is one of the same settings on another corpus (the same text under another corpus's name).
    other = tmp_path / "python-doc"
    shutil.copytree(data, other)
    (other / "corpus.json").write_text(json.dumps({"corpus": "python-doc"}))
    r = py(*[str(other) if a == str(data) else a for a in args[:-4]], "--out", str(tmp_path / "o.json"),
           "--checkpoint", str(ck))
    assert r.returncode != 0 and str(ck) in r.stderr and "another run" in r.stderr


def test_graph_mode_is_refused_where_it_cannot_run(data, tmp_path):
    # A CUDA graph needs a CUDA device, and trace capture hooks each step in Python: each a one-line error, exit 1,
    # before any training (no output written).
    for extra, want in ((["--device", "cpu"], "--graph: CUDA graphs need a CUDA device, not cpu"),
                        (["--device", "cuda", "--capture-steps", "3"], "--graph: trace capture (--capture-steps)")):
        r = py("train", "--data", str(data), "--size", "test", "--recipe", "ufp4", "--steps", "12", "--graph",
               "--out", str(tmp_path / "g.json"), *extra)
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == r.stderr.strip(), r.stderr
        assert want in r.stderr and not (tmp_path / "g.json").exists()


CUDA_RUN = torch.cuda.is_available() and _core.cuda_built


@pytest.mark.skipif(not CUDA_RUN, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["bf16", "ufp4", "nvfp4"])
def test_cuda_graph_runs_are_the_eager_runs_bit_for_bit(data, tmp_path, recipe):
    # --graph replays each step's forward and backward from a captured graph, captured again after each evaluation;
    # with --deterministic the losses are the eager run's bits. Also for a run stopped while a graph replays (steps
    # 13-17, after the evaluation at 12) and resumed: the layers' SR step must be where the eager run leaves it.
    def run(out, *extra):
        r = py("train", "--data", str(data), "--size", "test", "--recipe", recipe, "--steps", "30",
               "--eval-every", "12", "--eval-windows", "8", "--log-every", "10", "--device", "cuda",
               "--deterministic", "--out", str(out), *extra)
        return r.returncode, r.stderr
    assert run(tmp_path / "eager.json") == (0, "")
    assert run(tmp_path / "graph.json", "--graph") == (0, "")
    ck, parts = tmp_path / "ck.pt", tmp_path / "parts.json"
    assert run(parts, "--graph", "--checkpoint", str(ck), "--stop-at", "17") == (st.EXIT_CONTINUE, "")
    assert ck.exists() and not parts.exists()
    assert run(parts, "--graph", "--checkpoint", str(ck)) == (0, "")
    eager, graph, resumed = (json.load(open(tmp_path / f)) for f in ("eager.json", "graph.json", "parts.json"))
    assert graph["cuda_graph"] is True and eager["cuda_graph"] is False
    assert graph["val_steps"] == [12, 24, 30] == resumed["val_steps"]
    for k in ("train_loss", "val_loss"):
        assert graph[k] == eager[k] and resumed[k] == eager[k], k


def block(text, marker):
    i = text.index(f"<!-- {marker} -->") + len(f"<!-- {marker} -->")
    return text[i:text.index(f"<!-- end of {marker} -->")].strip()


def test_the_step_tables_of_the_results_are_generated_from_their_json():
    """docs/results/train-step-h200.md's tables are what `bench_train_step.py table --by-mode` makes of the JSON each
    names: nothing in them is typed by hand."""
    doc = open(os.path.join(ROOT, "docs", "results", "train-step-h200.md")).read()
    marker = "step table: scripts/bench_train_step.py table --by-mode "
    paths = re.findall(rf"<!-- {re.escape(marker)}(\S+) -->", doc)
    assert len(paths) == 9, paths
    for path in paths:
        want = bench_train_step().mode_table(json.load(open(os.path.join(ROOT, path))))
        assert block(doc, marker + path) == want, path


def test_docs_training_is_generated_from_the_committed_json(tmp_path):
    """docs/results/training.md's status, tables, throughput tables and proxy tables equal what the report, proxy and
    bench table commands make of the committed results: nothing in them is typed by hand."""
    doc = open(os.path.join(ROOT, "docs", "results", "training.md")).read()
    runs = json.load(open(os.path.join(ROOT, "docs", "results", "training.json")))["runs"]
    assert all(RUN_KEYS <= set(r) for r in runs)
    assert block(doc, "training tables: fp4lab-train report") == st.tables(runs).strip()
    assert block(doc, "training status: fp4lab-train report") == st.status(runs)
    bench = [json.load(open(os.path.join(ROOT, "docs", "results", f"bench-train-step-{m}-h200.json")))
             for m in ("small", "large")]
    assert [b["size"] for b in bench] == ["small", "large"]
    assert block(doc, "throughput tables: scripts/bench_train_step.py table") == "\n\n".join(
        bench_train_step().table(b) for b in bench)
    copy = tmp_path / "training.md"
    shutil.copy(os.path.join(ROOT, "docs", "results", "training.md"), copy)
    # The lab's proxy, whose --training default is the repository's docs/results/training.json.
    r = lab("proxy", "tiny-lm step 5000=docs/results/analysis.json+docs/results/analysis-ablations.json",
           "doc-lm step 200=docs/results/analysis-doc-lm-step200.json",
           "doc-lm step 1999=docs/results/analysis-doc-lm.json+docs/results/analysis-doc-lm-ablations.json",
           "--doc", str(copy), "--figure",
           str(tmp_path / "p.png"), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for marker in ("proxy tables: fp4lab-train proxy", "proxy paired: fp4lab-train proxy"):
        assert block(copy.read_text(), marker) == block(doc, marker)
    assert (tmp_path / "p_paired.png").stat().st_size > 0


def test_installed_commands_write_nowhere_unless_told(tmp_path):
    """fp4lab-train (the installed package's) has no default path into a repository's docs/: report and proxy
    need the results file named (exit 2, nothing written, even run where docs/results/training.json and
    docs/results/training.md are); the corpus extraction, the proxy study and the run names are the lab's commands."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "docs", "results", "training.json"), tmp_path / "docs" / "results")
    shutil.copy(os.path.join(ROOT, "docs", "results", "training.md"), tmp_path / "docs" / "results")
    ana = os.path.join(ROOT, "docs", "results", "analysis.json")

    def tree():
        return sorted((os.path.relpath(os.path.join(d, f), tmp_path), os.stat(os.path.join(d, f)).st_mtime_ns)
                      for d, _, fs in os.walk(tmp_path) for f in fs)
    before = tree()
    r = py("report", "--merge", cwd=tmp_path)
    assert r.returncode == 2 and "--json" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = py("proxy", f"t={ana}", cwd=tmp_path)
    assert r.returncode == 2 and "--training" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = py("proxy-study", f"t={ana}", "--training", "runs.json", cwd=tmp_path)
    assert r.returncode == 2 and "--json" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    for cmd in ("corpus", "name"):
        r = py(cmd, "x", cwd=tmp_path)
        assert r.returncode == 2 and "invalid choice" in r.stderr, r.stderr
    assert tree() == before


def test_report_and_proxy_refuse_bad_inputs_in_one_line_before_writing(tmp_path):
    """A missing, non-JSON or foreign input file: one line naming it and its fault, exit 1, nothing written."""
    ana = os.path.join(ROOT, "docs", "results", "analysis.json")
    training = os.path.join(ROOT, "docs", "results", "training.json")
    (tmp_path / "bad.json").write_bytes(b"{\"gemms\": [")
    (tmp_path / "latin1.json").write_bytes(b"{\"name\": \"\xe9\"}")
    (tmp_path / "list.json").write_text("[1, 2]")
    doc = tmp_path / "doc.md"
    doc.write_text("untouched\n")
    missing = str(tmp_path / "missing.json")
    cases = [
        (("proxy", f"t={missing}"), missing, "No such file or directory"),
        (("proxy", f"t={ana}+{tmp_path / 'bad.json'}"), str(tmp_path / "bad.json"), "not JSON"),
        (("proxy", f"t={tmp_path / 'list.json'}"), str(tmp_path / "list.json"), "no 'gemms' member"),
        (("proxy", f"t={ana}", "--training", ana), ana, "no 'runs' member"),
        (("proxy", f"t={ana}", "--doc", missing), missing, "No such file or directory"),
        (("report", missing), missing, "No such file or directory"),
        (("report", str(tmp_path / "latin1.json")), str(tmp_path / "latin1.json"), "not UTF-8 text"),
        (("report", str(tmp_path / "list.json")), str(tmp_path / "list.json"), "no run name"),
        (("report", "--merge", "--json", missing, "--doc", missing), missing, "No such file or directory"),
    ]
    for args, path, fault in cases:
        cmd = args[0]
        extra = [] if "--training" in args or cmd == "report" else ["--training", training]
        extra += [] if "--doc" in args else ["--doc", str(doc)]
        out = ["--figure", str(tmp_path / "f.png")] if cmd == "proxy" else [
            "--json", str(tmp_path / "t.json"), "--figures", str(tmp_path / "fig")]
        out = [] if "--json" in args else out
        r = py(*args, *extra, *out, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith(f"fp4lab-train {cmd}: error: {path}: ") and fault in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert sorted(os.listdir(tmp_path)) == ["bad.json", "doc.md", "latin1.json", "list.json"], args
        assert doc.read_text() == "untouched\n"


def test_bundled_doc_lm_trace_and_its_analysis(tmp_path):
    trace = os.path.join(ROOT, "workloads", "doc-lm", "step_001999")
    size = sum(os.path.getsize(os.path.join(trace, f)) for f in os.listdir(trace))
    assert len(os.listdir(trace)) == 8 and size <= 15_000_000
    out = tmp_path / "a.json"
    # The committed analyses were made under the original SR draw (docs/spec.md §4): philox1 reproduces them.
    r = subprocess.run([BIN, "analyze", "--trace", trace, "--recipe", "ufp4,e2m1-ref,nvfp4,mxfp4", "--sr-draw",
                        "philox1", "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.load(open(out))
    want = json.load(open(os.path.join(ROOT, "docs", "results", "analysis-doc-lm.json")))
    for key in ("tensors", "gemms", "inversion", "decay"):
        assert got[key] == want[key], key
    # The ablations' analyses that the proxy joins to the bundled traces' (docs/results/training.md) are what analyze gives.
    for tr, name in (("doc-lm/step_001999", "analysis-doc-lm-ablations.json"),
                     ("tiny-lm/step_005000", "analysis-ablations.json")):
        want = json.load(open(os.path.join(ROOT, "docs", "results", name)))
        assert want["config"]["recipes"] == [a for a in st.ABLATIONS if a not in st.PRESETS]
        r = subprocess.run([BIN, "analyze", "--trace", os.path.join(ROOT, "workloads", tr), "--recipe",
                            ",".join(want["config"]["recipes"]), "--sr-draw", "philox1", "--json", str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert json.load(open(out))["gemms"] == want["gemms"], name


def test_bench_train_step_times_the_training_models_and_recipes(tmp_path):
    """bench_train_step.py --size takes fp4lab.study's model shape and recipe names (ablations included); its JSON
    is what the table of docs/results/training.md is made from."""
    bench = os.path.join(ROOT, "scripts", "bench_train_step.py")
    out = tmp_path / "b.json"
    # --seq overrides the size's 64, so that the synthetic stream's 64-token motif repeats and can be learnt.
    r = subprocess.run([sys.executable, bench, "--size", "test", "--seq", "256", "--device", "cpu", "--warmup", "1",
                        "--steps", "4", "--recipes", "ufp4-rht-none", "--modes", "exact", "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    info = json.load(open(out))
    shape = dict(st.SIZES["test"], seq=256)
    assert info["size"] == "test" and info["model"] == dict({k: shape[k] for k in info["model"] if k != "vocab"},
                                                            vocab=256)
    assert [(row["recipe"], row["mode"]) for row in info["rows"]] == [("bf16", "-"), ("ufp4-rht-none", "exact")]
    for row in info["rows"]:
        assert row["steps_timed"] == 4
        assert row["tokens_per_s"] == shape["batch"] * shape["seq"] / (row["median_ms"] / 1e3)
    assert info["rows"][1]["vs_bf16"] == info["rows"][1]["median_ms"] / info["rows"][0]["median_ms"]
    r = subprocess.run([sys.executable, bench, "--recipes", "e3m0"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "unknown recipe e3m0" in r.stderr
    # Without --size it times docs/spec.md §12's reference model, whose shape it takes from the large model.
    spec = " ".join(open(os.path.join(ROOT, "docs", "spec.md")).read().split())
    s = bench_train_step().SPEC_SHAPE
    assert (f"d {s['d']}, {s['layers']} layers, {s['heads']} heads, FFN {s['ffn']}, sequence {s['seq']}, batch "
            f"{s['batch']}") in spec


def test_bench_idle_report_charges_each_gap_to_the_phase_that_launched_the_work_after_it(tmp_path, capsys):
    """--profile's account of the GPU's idle time in a step, on a trace of two steps whose gaps are known: a gap is
    charged to the phase whose host code launched the work that ended it (through the runtime or the driver); a
    step's first gap runs from the step's start, not from the last step's work; overlapping work leaves no gap; work
    launched between steps (the loss read) counts neither as busy nor idle, and work whose launch is missing is
    busy."""
    def x(cat, name, ts, dur, corr=None):  # times in units of 100 µs
        return {"ph": "X", "cat": cat, "name": name, "ts": 100 * ts, "dur": 100 * dur,
                **({"args": {"correlation": corr}} if corr is not None else {})}
    events = [x("user_annotation", "step:forward", 0, 100), x("user_annotation", "step:backward", 100, 200),
              x("user_annotation", "step:forward", 1000, 100)]
    k3 = "void fp4lab::cuda::(anonymous namespace)::k3<16>(fp4lab::cuda::Args)"
    for corr, (launch, start, dur, name) in enumerate([(10, 20, 30, "k1(int)"), (15, 25, 10, "k5"),
                                                       (60, 70, 10, "void k2<1>(float)"), (150, 160, 40, k3),
                                                       (400, 410, 10, "k4"), (1010, 1040, 10, "k6")]):
        events += [x("cuda_runtime", "cudaLaunchKernel", launch, 1, corr), x("kernel", name, start, dur, corr)]
    # A cuBLAS kernel launched through the driver in the backward, and a kernel whose launch is missing.
    events += [x("cuda_driver", "cuLaunchKernelEx", 202, 1, 7), x("kernel", "gemm", 205, 15, 7),
               x("kernel", "orphan", 230, 10, 8)]

    class Prof:
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)
    bench_train_step().idle_report(Prof(), str(tmp_path))
    out = capsys.readouterr().out.splitlines()
    # Busy: k1 (20-50, k5 inside it) 30, k2 10, k3 40, gemm 15, orphan 10, k6 10: 115, 57.5 a step. Idle: 20 from
    # the first step's start to k1 and 20 before k2 (forward); 80 before k3 and 5 before gemm (backward); 10 before
    # orphan; 40 from the second step's start to k6 (forward; k4, between the steps, ends at 420): 175, 87.5 a step.
    assert out[0] == ("GPU idle inside the profiled steps: 8.75 ms a step (busy 5.75 ms), by the phase that launched "
                      "the waiting work: backward 4.25, forward 4.00, launch not in the trace 0.50")
    assert out[1:] == ["    4.000 ms a step before void fp4lab::cuda::k3", "    2.000 ms a step before k6",
                       "    1.000 ms a step before k1", "    1.000 ms a step before void k2",
                       "    0.500 ms a step before orphan", "    0.250 ms a step before gemm"]
    assert os.listdir(tmp_path) == []


def test_bench_bound_puts_an_exact_step_against_its_contract_gemms_at_the_epilogue_bound(tmp_path, capsys):
    """--bound: the contract GEMMs' time a profiled step (their main kernels only, per step), and each exact row's
    bound, the row less that time plus the same GEMMs at the epilogue bound; the kernel names are the sources'."""
    b = bench_train_step()
    src = open(os.path.join(ROOT, "kernels", "src", "gemm.cu")).read()
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(", src))
    # gemm.cu's kernels: the reference (one thread per output), the prepare pass and the two tensor-core kernels.
    assert kernels == {"gemm_reference_kernel", "prepare_kernel", "gemm_mma_kernel", "gemm_wgmma_kernel"}
    assert b.CONTRACT_GEMM_KERNELS == ("gemm_mma_kernel", "gemm_wgmma_kernel")
    events = [{"ph": "X", "cat": "user_annotation", "name": "step:forward", "ts": 0, "dur": 10},
              {"ph": "X", "cat": "user_annotation", "name": "step:forward", "ts": 100, "dur": 10}]
    for name, dur in (("void fp4lab::cuda::(anonymous namespace)::gemm_mma_kernel<Tile<128> >(FastArgs)", 3000),
                      ("void fp4lab::cuda::(anonymous namespace)::gemm_wgmma_kernel<16>(FastArgs)", 1000),
                      ("void fp4lab::cuda::(anonymous namespace)::prepare_kernel(PrepArgs)", 500),
                      ("sm90_xmma_gemm_bf16bf16", 700)):
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": 20, "dur": dur})

    class Prof:
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)
    assert b.kernel_ms(Prof(), str(tmp_path), b.CONTRACT_GEMM_KERNELS) == 2.0  # 4000 µs over two steps
    assert os.listdir(tmp_path) == []
    rows = [{"recipe": "bf16", "mode": "-", "median_ms": 20.0}, {"recipe": "ufp4", "mode": "fast", "median_ms": 25.0},
            {"recipe": "ufp4", "mode": "exact", "median_ms": 60.0},
            {"recipe": "ufp4", "mode": "exact+graph", "median_ms": 58.0},
            {"recipe": "ufp4", "mode": "exact+variant3", "median_ms": 59.0}]
    bounds = {"ufp4": {"gemm_ms": 36.0, "gemm_bound_ms": 18.0, "gemm_ops": 5 * 10**12,
                       "epilogue_forms": [(4, 16, 268e12)], "sms": 132, "clock_khz": 1980000}}
    lines = b.bound_rows(rows, bounds, 20.0)
    assert "bound_ms" not in rows[1]
    assert [(r["bound_ms"], r["bound_vs_bf16"]) for r in rows[2:4]] == [(42.0, 2.1), (40.0, 2.0)]
    assert "bound_ms" not in rows[4] and len(lines) == 2  # a forced variant's GEMMs are not the ones timed
    assert rows[3]["over_bound"] == 58.0 / 40.0 - 1
    assert lines[1] == ("ufp4 exact+graph: 58.00 ms, of which the contract GEMMs 36.00; at the epilogue bound "
                        "(4 FP32 instructions per output and 16-block (268 TOPS)) they take 18.00, so the step's "
                        "bound is 40.00 ms (2.00x BF16) and the step is 45% above it")
    # `table --by-mode`: a row per recipe and GEMM mode, the ways of running side by side, the captured bound.
    rows[0:1] = [{"recipe": "bf16", "mode": "-", "median_ms": 20.0}, {"recipe": "bf16", "mode": "graph",
                                                                        "median_ms": 19.0}]
    assert b.mode_table({"rows": rows}).splitlines() == [
        "| recipe | GEMMs | eager ms | × BF16 | compiled ms | × BF16 | captured ms | × BF16 | bound ms | × BF16 | "
        "above bound |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| bf16 |  | 20.00 | 1.00 | – |  | 19.00 | 0.95 |  |  |  |",
        "| ufp4 | fast | 25.00 | 1.25 | – |  | – |  |  |  |  |",
        "| ufp4 | exact | 60.00 | 3.00 | – |  | 58.00 | 2.90 | 40.00 | 2.00 | 45% |"]
    # --pipelined: the back-to-back table follows, each row against BF16's eager steps back to back.
    for r, ms in zip(rows, (16.0, 18.0, 20.0, 48.0, 50.0, 52.0)):
        r.update(pipelined_ms=ms, steps_timed=10)
    assert b.mode_table({"rows": rows}).splitlines()[5:] == [
        "", "Back to back (10 steps, one synchronisation), against BF16's eager steps back to back:", "",
        "| recipe | GEMMs | eager ms | × BF16 | compiled ms | × BF16 | captured ms | × BF16 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        "| bf16 |  | 16.00 | 1.00 | – |  | 18.00 | 1.12 |",
        "| ufp4 | fast | 20.00 | 1.25 | – |  | – |  |",
        "| ufp4 | exact | 48.00 | 3.00 | – |  | 50.00 | 3.12 |"]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_train_step.py"), "--recipes", "ufp4",
                        "--bound", "nvfp4", "--device", "cpu"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "--bound nvfp4: nvfp4 not in --recipes" in r.stderr
    for extra, fault in ((["--bound", "ufp4"], "it needs a CUDA --device"),
                         (["--bound", "ufp4", "--device", "cuda", "--modes", "fast"], "--modes has none"),
                         (["--compile", "ufp4:fastt"], "--compile ufp4:fastt: NAME:MODE names"),
                         (["--pipelined"], "--pipelined times steps by CUDA events: it needs a CUDA --device")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_train_step.py"), "--recipes", "ufp4",
                            "--device", "cpu", *extra], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and fault in r.stderr, (extra, r.stderr)


def test_a_report_pairs_runs_of_one_sr_draw_and_names_runs_by_theirs(tmp_path):
    """docs/spec.md §4: runs under philox1 (recorded before the draw existed, or given --sr-draw philox1) and under
    philox4 are not paired in one report; the run-spec names of scripts/train_study.sh carry a run's draw."""
    def run(name, recipe, **extra):
        r = {"name": name, "model": "test", "recipe": recipe, "gemm_mode": "exact", "seed": 0, "params": 10,
             "block_params": 8, "tokens_per_s": 1.0, "steps": [1, 2], "train_loss": [3.0, 2.0], "val_steps": [2],
             "val_loss": [2.5], "config": {"d": 64, "layers": 2, "seq": 64, "batch": 4, "steps": 2}, **extra}
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(r))
        return str(p)
    old = run("a", "ufp4")  # no sr_draw: recorded before it existed, philox1
    new = run("b", "e2m1-ref", sr_draw="philox4")
    bf = run("c", "bf16", sr_draw=None)
    out = ["--json", str(tmp_path / "t.json"), "--doc", "", "--figures", ""]
    r = py("report", old, new, bf, *out)
    assert r.returncode == 1 and "trained under philox1 and philox4" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists()
    assert py("report", new, bf, *out).returncode == 0
    bad = run("d", "ufp4", sr_draw="philox2")
    r = py("report", bad, *out)
    assert r.returncode == 1 and "'sr_draw' is none of philox1, philox4, philox16" in r.stderr
    names = lab("name", "test:ufp4:exact:0:12:--sr-draw philox1", "test:ufp4:exact:0:12", "test:bf16:exact:0:12")
    assert names.stdout.split() == ["test-ufp4-exact-s0-12-philox1", "test-ufp4-exact-s0-12", "test-bf16-bf16-s0-12"]
    assert lab("name", "test:ufp4:exact:0:12:--sr-draw philox9").returncode == 2
