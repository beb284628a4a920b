"""Documentation that matches the code: the public API has docstrings, the repository cites
only documents it contains, and the README names what the API exports."""
from pathlib import Path

import megak

ROOT = Path(__file__).resolve().parents[1]


def test_graph_methods_and_compile_have_their_own_docs():
    for name in ("input", "output", "copy", "transpose", "gemm", "add", "softmax",
                 "layernorm", "rmsnorm"):
        doc = getattr(megak.Graph, name).__doc__ or ""
        assert len(doc.strip()) > 40, name
        assert not doc.lstrip().startswith("#"), name
    assert "float32" in megak.Graph.input.__doc__
    for word in ("n_sm", "n_pages", "MEGAK_BACKEND"):
        assert word in megak.compile.__doc__, word
    for name in ("run", "launch", "check", "close"):
        assert getattr(megak.Program, name).__doc__, name


def test_no_file_cites_a_document_the_repository_lacks():
    cited = []
    for path in [ROOT / "README.md", *ROOT.glob("megak/**/*.*"), *ROOT.glob("benchmarks/*.py"),
                 *ROOT.glob("benchmarks/*.md"), *ROOT.glob("tools/*")]:
        if path.is_file() and path.suffix in (".py", ".md", ".cu", ".cuh", ".h", ".sh"):
            if "DESIGN.md" in path.read_text(errors="replace"):
                cited.append(str(path.relative_to(ROOT)))
    assert not cited, f"cite docs/ARCHITECTURE.md instead: {cited}"
    assert (ROOT / "docs" / "ARCHITECTURE.md").exists()


def test_the_readme_names_the_public_api():
    text = (ROOT / "README.md").read_text()
    for name in ("megak.Graph", "megak.compile", "megak.bfloat16", "prog.launch", "prog.check",
                 "prog.stats", "prog.close", "g.inputs", "g.add", "g.softmax", "g.layernorm",
                 "g.rmsnorm", "megak.GraphError", "megak.MegakernelHang"):
        assert name in text, name
