"""The documentation says what the repository holds: README's line table is the shipped
HPCAI500.dat, the module paths README.md and DESIGN.md name exist, every harness module
is in README's Layout and DESIGN's module map, every citation of a DESIGN.md section
points to a section that exists, and README's schema version, refusal of old input files
and scaling groups are what the code does. No MPI, no TensorFlow."""
import re

import pytest

from harness import dat
from tests.conftest import ROOT, result

README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "DESIGN.md").read_text()
SHIPPED = ROOT / "HPCAI500.dat"
# A sweep line's values, and the line holding their count (as dat.parse_text reads them).
SWEEPS = {7: 6, 10: 9, 11: 9, 14: 13, 17: 16}
PENDING = set()  # modules named before they exist (none now: every name is checked)
# The lines whose value is a keyword of one of the option tables (harness/dat.CHOICES)
KEYWORD_LINES = {7: "workload", 17: "precision", 18: "optimizer", 21: "comm_precision", 22: "allreduce",
                 23: "sampler", 24: "aggregation"}


def readme_lines() -> dict:
    """{line: shipped value} of README's "HPCAI500.dat, line by line" table; '1-2' kept as text."""
    rows = {}
    for m in re.finditer(r"^\| *(\d+(?:-\d+)?) *\| *([^|]*?) *\|", README, re.M):
        key, shipped = m.group(1), m.group(2)
        rows[int(key) if key.isdigit() else key] = shipped
    return rows


def shipped_tokens(lines: list[str], n: int) -> list[str]:
    """The value tokens of line n of the shipped file: as many as the parser takes."""
    toks = lines[n - 1].split()
    if n in SWEEPS:
        return toks[:int(lines[SWEEPS[n] - 1].split()[0])]
    if n == 28 and len(toks) > 1 and toks[1].lower() == "keep":
        return toks[:2]
    return toks[:1]


def test_readme_documents_every_line():
    rows = readme_lines()
    assert rows.get("1-2") == "titles", "README's table must start with the title lines 1-2"
    assert sorted(k for k in rows if isinstance(k, int)) == list(range(3, dat.NLINES + 1))


@pytest.mark.parametrize("n", range(3, dat.NLINES + 1))
def test_readme_shipped_value_is_the_file(n):
    lines = SHIPPED.read_text().splitlines()
    shown = readme_lines()[n]
    m = re.fullmatch(r"`([^`]+)`", shown)
    assert m, f"README line {n}: shipped value {shown!r} is not one `code` span"
    assert m.group(1).split() == shipped_tokens(lines, n), \
        f"README says line {n} ships {m.group(1)!r}; HPCAI500.dat line {n} is {lines[n - 1]!r}"


def test_readme_sweeps_are_what_the_parser_reads():
    cfg = dat.parse(str(SHIPPED))
    parsed = {7: cfg.workloads, 10: [m for m, _ in cfg.layouts], 11: [p for _, p in cfg.layouts],
              14: cfg.batch_sizes, 17: cfg.precisions, 15: [cfg.epochs], 29: [cfg.seed]}
    rows = readme_lines()
    for n, values in parsed.items():
        assert rows[n].strip("`").split() == [str(v) for v in values], f"line {n}"
    lines = SHIPPED.read_text().splitlines()
    assert lines[0].strip() and lines[1].strip(), "title lines 1-2 must be there"


PATH = re.compile(r"(?<![\w/.<-])((?:harness|kernels|bench|tests|scripts)/[\w./-]*?\w\.(?:py|sbatch|md))\b")


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text)) | ({"hpcai500.py"} if "hpcai500.py" in text else set())


@pytest.mark.parametrize("doc", ["README.md", "DESIGN.md"])
def test_named_modules_exist(doc):
    names = named_paths((ROOT / doc).read_text())
    assert len(names) >= 3, f"{doc}: expected module paths such as harness/dat.py, found {names}"
    missing = sorted(p for p in names - PENDING if not (ROOT / p).is_file())
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_design_section_citations_exist():
    sections = set(re.findall(r"^## (\d+)\. ", DESIGN, re.M))
    assert sections, "DESIGN.md has no numbered '## N. ' sections"
    cite = re.compile(r"DESIGN(?:\.md)?,?\s+(?:\u00a7\s*|section\s+)(\d+)")
    files = [ROOT / "README.md", ROOT / "requirements.txt", ROOT / "Makefile", ROOT / "hpcai500.py",
             *sorted((ROOT / "harness").rglob("*.py")), *sorted((ROOT / "kernels").glob("*.py")),
             *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "bench").glob("*.md"))]
    stale = [f"{f.relative_to(ROOT)}: DESIGN section {n}" for f in files
             for n in cite.findall(f.read_text()) if n not in sections]
    assert not stale, f"citations of DESIGN.md sections that do not exist: {stale}"


@pytest.mark.parametrize("n,kind", KEYWORD_LINES.items())
def test_shipped_file_and_readme_name_every_choice_of_the_tables(n, kind):
    """The free text of the shipped file and README's row list exactly the choices the
    option table beside the implementation holds (one table, two echoes of it)."""
    free = " ".join(SHIPPED.read_text().splitlines()[n - 1].split()[len(shipped_tokens(
        SHIPPED.read_text().splitlines(), n)):])
    listed = re.search(r"\(([^);]*)", free).group(1)
    assert [w.strip() for w in listed.split(",")] == list(dat.KNOWN[kind]), (n, free)
    row = re.search(rf"^\| {n} \|[^|]*\|(.*)\|$", README, re.M).group(1)
    assert all(f"`{name}`" in row for name in dat.KNOWN[kind]), (n, row)


def test_readme_lists_every_setting_of_the_table():
    from harness import settings
    section = README.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(HPCAI500_[A-Z_]+)` \| ([^|]*) \|[^|]*\|([^|]*)\|", section, re.M)
    assert [name for name, _, _ in rows] == list(settings.TABLE)
    for name, default, test_only in rows:
        s = settings.TABLE[name]
        assert (test_only.strip() == "yes") == s.test_only, name
        assert default.strip() == ("-" if s.default is None else f"{s.default:g}" if isinstance(s.default, float)
                                   else str(s.default)), name


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.dat")), ids=lambda p: p.name)
def test_example_sweeps_parse_and_hold_what_their_experiment_needs(path):
    """examples/: each sweep parses, and holds two or more layouts of one Sys_scale (so
    the report prints its comparison or trade-off) that fit the ranks the README gives."""
    cfg = dat.parse(str(path))
    scales = [m * p for m, p in cfg.layouts]
    assert any(scales.count(s) >= 2 for s in scales), cfg.layouts
    command = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if f"examples/{path.name}" in ln)
    ranks = int(command.split("-np ")[1].split()[0])
    assert max(scales) <= ranks and cfg.eval_every >= 1     # time to quality needs evaluations along the way



# ---- the kinds of drift found once (issue 25): each checked against the code ----------

def _harness_modules() -> list[str]:
    """Every module of harness/ and its packages (workloads/, frameworks/...), by name."""
    return sorted(p.stem for p in (ROOT / "harness").rglob("*.py") if p.stem != "__init__")


def test_readme_layout_and_design_module_map_name_every_harness_module():
    layout = README[README.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    design_map = DESIGN[DESIGN.index("## 3. Components and module map"):DESIGN.index("\n## 4. ")]
    missing_readme = [m for m in _harness_modules() if f"`{m}`" not in layout]
    # by path: a stem names a module in several packages (deepcam.py in each framework's)
    missing_design = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "harness").rglob("*.py"))
                      if p.stem != "__init__" and str(p.relative_to(ROOT)) not in design_map]
    assert not missing_readme, f"README's Layout does not name harness modules {missing_readme}"
    assert not missing_design, f"DESIGN.md §3 does not name harness modules {missing_design}"


def test_readme_states_the_schema_version_results_json_carries():
    from harness import results
    assert re.findall(r"`schema` version \(now ([\d.]+)\)", README) == [results.SCHEMA]


def test_readme_names_the_lines_the_parser_asks_an_old_file_to_add():
    """For each line added since the first release, a shipped file cut just before it is
    refused naming the span README gives for a file of that length."""
    rows, flat = SHIPPED.read_text().splitlines(), " ".join(README.split())   # README's lines wrap
    for first in dat.ADDED:
        with pytest.raises(dat.DatError) as e:
            dat.parse_text("\n".join(rows[:first - 1]) + "\n")
        span = re.search(r"expected (lines? [\d-]+) ", str(e.value)).group(1)
        assert e.value.line_no == first and f"a {first - 1}-line file" in flat, str(e.value)
        said = re.search(rf"a {first - 1}-line file \([^)]*\) names (lines? [\d-]+)", flat)
        assert said and said.group(1) == span, (said and said.group(0), str(e.value))


def test_readme_groups_the_scaling_lines_by_the_fields_the_report_groups_by():
    """README's "(workload, B, precision, P)": tests differing in a named field get lines
    of their own; tests differing only in M share one."""
    from harness import metrics, report
    fields = re.search(r"a scaling line for every \(([^)]*)\)", README).group(1).split(", ")
    base = {"workload": "digits", "framework": "tensorflow", "B": 32, "precision": "fp32", "P": 1}
    def tests(ms=(1, 2), **change):
        return [result(**{**base, "M": m, "flops": m * 1.0, "train_seconds": 5.0, **change}) for m in ms]
    assert len(report.scaling_lines(tests((1, 2, 4)), metrics.weak_scaling)) == 1   # M alone: one line
    other = {"workload": "ic", "framework": "pytorch", "B": 64, "precision": "fp16", "P": 2}
    for field in base:
        lines = report.scaling_lines(tests() + tests(**{field: other[field]}), metrics.weak_scaling)
        assert (len(lines) == 2) == (field in fields), (field, fields, lines)
