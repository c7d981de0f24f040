"""The documentation says what the repository holds, and cannot drift from it.

docs/tuning.md documents every HPCAI500.dat line with the shipped value and every keyword
choice; docs/running.md every command-line flag and every HPCAI500_* setting; the module
paths, files and links the documents name exist; every harness module is in
contributing.md's Layout and DESIGN's module map; every citation of a DESIGN.md section
points to a section that exists; the schema version, the old input files' refusal and the
scaling groups are what the code does; CHANGELOG.md has every schema version; the README
routes (short, every document linked, the four tasks on its first screen); the user
documents hold no dated figure; and the sample run in examples/ is the current code's
output (--verify). No MPI, no TensorFlow."""
import contextlib
import io
import json
import re

import pytest

from harness import dat
from tests.conftest import ROOT, result

README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "DESIGN.md").read_text()
DOCS = ROOT / "docs"
TUNING = (DOCS / "tuning.md").read_text()
RUNNING = (DOCS / "running.md").read_text()
SUBMITTING = (DOCS / "submitting.md").read_text()
CONTRIBUTING = (DOCS / "contributing.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
SHIPPED = ROOT / "HPCAI500.dat"
SAMPLE = ROOT / "examples" / "sample-run"
# Every document a reader is sent to: the README, docs/, the changelog
DOCUMENTS = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "CHANGELOG.md"]
# The documents that must state only facts that stay true (issue 68): no dated figure,
# no "this machine" or "here", no history
USER_DOCUMENTS = ["README.md", "docs/tuning.md", "docs/running.md", "docs/submitting.md"]
# A sweep line's values, and the line holding their count (as dat.parse_text reads them).
SWEEPS = {7: 6, 10: 9, 11: 9, 14: 13, 17: 16}
PENDING = set()  # modules named before they exist (none now: every name is checked)
# The lines whose value is a keyword of one of the option tables (harness/dat.CHOICES)
KEYWORD_LINES = {7: "workload", 17: "precision", 18: "optimizer", 21: "comm_precision", 22: "allreduce",
                 23: "sampler", 24: "aggregation"}


def _rel(path) -> str:
    return str(path.relative_to(ROOT))


# ---- docs/tuning.md: HPCAI500.dat line by line ------------------------------------------

LINE_HEADING = re.compile(r"^### Lines? (\d+(?:-\d+)?): (.*)$", re.M)


def tuning_lines() -> dict:
    """{line: its heading's text after 'Line N: '} of tuning.md's line-by-line sections; '1-2' kept as text."""
    return {int(k) if k.isdigit() else k: text for k, text in LINE_HEADING.findall(TUNING)}


def tuning_section(n: int) -> str:
    """The text of line n's section of tuning.md, its heading to the next heading."""
    m = re.search(rf"^### Line {n}: .*$", TUNING, re.M)
    rest = TUNING[m.end():]
    return m.group(0) + rest[:re.search(r"^#{1,3} ", rest, re.M).start()]


def shipped_value(n: int) -> str:
    """The shipped value a line's heading gives: '... (shipped `VALUE`)'."""
    m = re.search(r"\(shipped `([^`]+)`\)$", tuning_lines()[n])
    assert m, f"tuning.md line {n}: heading {tuning_lines()[n]!r} does not end with (shipped `VALUE`)"
    return m.group(1)


def shipped_tokens(lines: list[str], n: int) -> list[str]:
    """The value tokens of line n of the shipped file: as many as the parser takes."""
    toks = lines[n - 1].split()
    if n in SWEEPS:
        return toks[:int(lines[SWEEPS[n] - 1].split()[0])]
    if n == 28 and len(toks) > 1 and toks[1].lower() == "keep":
        return toks[:2]
    return toks[:1]


def test_tuning_documents_every_line_in_order():
    keys = list(tuning_lines())
    assert keys[0] == "1-2" and tuning_lines()["1-2"] == "titles", "tuning.md must start with the title lines 1-2"
    assert keys[1:] == list(range(3, dat.NLINES + 1)), keys


@pytest.mark.parametrize("n", range(3, dat.NLINES + 1))
def test_tuning_shipped_value_is_the_file(n):
    lines = SHIPPED.read_text().splitlines()
    assert shipped_value(n).split() == shipped_tokens(lines, n), \
        f"tuning.md says line {n} ships {shipped_value(n)!r}; HPCAI500.dat line {n} is {lines[n - 1]!r}"


def test_tuning_shows_the_shipped_file_verbatim():
    block = TUNING.split("## The file", 1)[1].split("```\n", 2)[1]
    assert block == SHIPPED.read_text(), "tuning.md's copy of HPCAI500.dat is not the shipped file"


def test_tuning_sweeps_are_what_the_parser_reads():
    cfg = dat.parse(str(SHIPPED))
    parsed = {7: cfg.workloads, 10: [m for m, _ in cfg.layouts], 11: [p for _, p in cfg.layouts],
              14: cfg.batch_sizes, 17: cfg.precisions, 15: [cfg.epochs], 29: [cfg.seed]}
    for n, values in parsed.items():
        assert shipped_value(n).split() == [str(v) for v in values], f"line {n}"
    lines = SHIPPED.read_text().splitlines()
    assert lines[0].strip() and lines[1].strip(), "title lines 1-2 must be there"


@pytest.mark.parametrize("n,kind", KEYWORD_LINES.items())
def test_shipped_file_and_tuning_name_every_choice_of_the_tables(n, kind):
    """The free text of the shipped file and tuning.md's section list exactly the choices the
    option table beside the implementation holds (one table, two echoes of it)."""
    free = " ".join(SHIPPED.read_text().splitlines()[n - 1].split()[len(shipped_tokens(
        SHIPPED.read_text().splitlines(), n)):])
    listed = re.search(r"\(([^);]*)", free).group(1)
    assert [w.strip() for w in listed.split(",")] == list(dat.KNOWN[kind]), (n, free)
    section = tuning_section(n)
    assert all(f"`{name}`" in section for name in dat.KNOWN[kind]), (n, section)


def test_tuning_names_the_lines_the_parser_asks_an_old_file_to_add():
    """For each line added since the first release, a shipped file cut just before it is
    refused naming the span tuning.md (and the changelog) gives for a file of that length."""
    rows = SHIPPED.read_text().splitlines()
    for doc in (TUNING, CHANGELOG):
        flat = " ".join(doc.split())   # the lines wrap
        for first in dat.ADDED:
            with pytest.raises(dat.DatError) as e:
                dat.parse_text("\n".join(rows[:first - 1]) + "\n")
            span = re.search(r"expected (lines? [\d-]+) ", str(e.value)).group(1)
            assert e.value.line_no == first and f"a {first - 1}-line file" in flat, str(e.value)
            said = re.search(rf"a {first - 1}-line file (?:\([^)]*\) )?names (lines? [\d-]+)", flat)
            assert said and said.group(1) == span, (said and said.group(0), str(e.value))


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.dat")), ids=lambda p: p.name)
def test_example_sweeps_parse_and_hold_what_their_experiment_needs(path):
    """examples/: each sweep parses, and holds two or more layouts of one Sys_scale (so
    the report prints its comparison or trade-off) that fit the ranks tuning.md gives."""
    cfg = dat.parse(str(path))
    scales = [m * p for m, p in cfg.layouts]
    assert any(scales.count(s) >= 2 for s in scales), cfg.layouts
    command = next(ln for ln in TUNING.splitlines() if f"examples/{path.name}" in ln)
    ranks = int(command.split("-np ")[1].split()[0])
    assert max(scales) <= ranks and cfg.eval_every >= 1     # time to quality needs evaluations along the way


# ---- docs/running.md: the command line and the settings ----------------------------------

def _help() -> str:
    from harness import driver
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        driver.parse_args(["--help"])
    return out.getvalue()


def test_running_documents_every_flag_of_the_command_line():
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", _help()))
    assert {"--check", "--verify", "--status", "--resume"} <= flags, flags   # the help was read
    bullets = set(re.findall(r"^\* `(--[a-z-]+)", RUNNING.split("## Command line", 1)[1].split("\n## ", 1)[0], re.M))
    assert flags == bullets, f"running.md's Command line: {sorted(flags - bullets)} missing, " \
                             f"{sorted(bullets - flags)} not flags of hpcai500.py --help"


def test_running_lists_every_setting_of_the_table():
    from harness import settings
    section = RUNNING.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(HPCAI500_[A-Z_]+)` \| ([^|]*) \|[^|]*\|([^|]*)\|", section, re.M)
    assert [name for name, _, _ in rows] == list(settings.TABLE)
    for name, default, test_only in rows:
        s = settings.TABLE[name]
        assert (test_only.strip() == "yes") == s.test_only, name
        assert default.strip() == ("-" if s.default is None else f"{s.default:g}" if isinstance(s.default, float)
                                   else str(s.default)), name


def test_the_checklist_names_every_test_only_setting():
    from harness import settings
    test_only = {name for name, s in settings.TABLE.items() if s.test_only}
    checklist = SUBMITTING.split("## Checklist", 1)[1].split("\n## ", 1)[0]
    assert test_only and all(f"`{name}`" in checklist for name in test_only), sorted(test_only)


def test_running_states_the_schema_version_results_json_carries():
    from harness import results
    assert re.findall(r"`schema` version \(now ([\d.]+)\)", " ".join(RUNNING.split())) == [results.SCHEMA]


def test_status_exit_codes_in_the_readme_and_running_are_the_code():
    from harness import heartbeat
    flat = " ".join(README.split())
    for code, state in ((c, n) for n, c in heartbeat.EXIT.items() if c):
        assert f"**{code}** {state.replace('-', ' ')}" in flat or f"**{code}** {state}" in flat, (code, state)
        assert f"**{code}** {state}" in " ".join(RUNNING.split()) or \
               f"**{code}** {state.replace('-', ' ')}" in " ".join(RUNNING.split()), (code, state)


# ---- docs/submitting.md --------------------------------------------------------------------

def test_submitting_groups_the_scaling_lines_by_the_fields_the_report_groups_by():
    """"a scaling line for every (workload, framework, B, precision, P)": tests differing in a
    named field get lines of their own; tests differing only in M share one."""
    from harness import metrics, report
    fields = re.search(r"a scaling line for\s+every \(([^)]*)\)", SUBMITTING).group(1).split(", ")
    base = {"workload": "digits", "framework": "tensorflow", "B": 32, "precision": "fp32", "P": 1}

    def tests(ms=(1, 2), **change):
        return [result(**{**base, "M": m, "flops": m * 1.0, "train_seconds": 5.0, **change}) for m in ms]
    assert len(report.scaling_lines(tests((1, 2, 4)), metrics.weak_scaling)) == 1   # M alone: one line
    other = {"workload": "ic", "framework": "pytorch", "B": 64, "precision": "fp16", "P": 2}
    for field in base:
        lines = report.scaling_lines(tests() + tests(**{field: other[field]}), metrics.weak_scaling)
        assert (len(lines) == 2) == (field in fields), (field, fields, lines)


# ---- docs/contributing.md and DESIGN.md: the modules -------------------------------------

PATH = re.compile(r"(?<![\w/.<-])((?:harness|kernels|bench|tests|scripts|docs|examples)/[\w./-]*?\w"
                  r"\.(?:py|sbatch|md|sh|dat|txt|yaml|json))\b")
TOP = re.compile(r"(?<![\w/.<-])(requirements(?:-\w+)?\.txt|HPCAI500\.dat|Makefile|LICENSE|CHANGELOG\.md)\b")


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text)) | set(TOP.findall(text)) | ({"hpcai500.py"} if "hpcai500.py" in text else set())


@pytest.mark.parametrize("doc", ["DESIGN.md", *[_rel(d) for d in DOCUMENTS]])
def test_named_files_exist(doc):
    names = named_paths((ROOT / doc).read_text())
    missing = sorted(p for p in names - PENDING if not (ROOT / p).is_file())
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_the_documents_name_modules():
    assert len(named_paths(CONTRIBUTING)) >= 3 and len(named_paths(DESIGN)) >= 3   # the scan finds paths


def test_design_section_citations_exist():
    sections = set(re.findall(r"^## (\d+)\. ", DESIGN, re.M))
    assert sections, "DESIGN.md has no numbered '## N. ' sections"
    cite = re.compile(r"DESIGN(?:\.md)?,?\s+(?:\u00a7\s*|section\s+)(\d+)")
    files = [*DOCUMENTS, ROOT / "requirements.txt", ROOT / "Makefile", ROOT / "hpcai500.py",
             *sorted((ROOT / "harness").rglob("*.py")), *sorted((ROOT / "kernels").glob("*.py")),
             *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "bench").glob("*.md"))]
    stale = [f"{_rel(f)}: DESIGN section {n}" for f in files
             for n in cite.findall(f.read_text()) if n not in sections]
    assert not stale, f"citations of DESIGN.md sections that do not exist: {stale}"


def _harness_modules() -> list[str]:
    """Every module of harness/ and its packages (workloads/, frameworks/...), by name."""
    return sorted(p.stem for p in (ROOT / "harness").rglob("*.py") if p.stem != "__init__")


def test_contributing_layout_and_design_module_map_name_every_harness_module():
    layout = CONTRIBUTING[CONTRIBUTING.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    design_map = DESIGN[DESIGN.index("## 3. Components and module map"):DESIGN.index("\n## 4. ")]
    missing_layout = [m for m in _harness_modules() if f"`{m}`" not in layout]
    # by path: a stem names a module in several packages (deepcam.py in each framework's)
    missing_design = [_rel(p) for p in sorted((ROOT / "harness").rglob("*.py"))
                      if p.stem != "__init__" and _rel(p) not in design_map]
    assert not missing_layout, f"contributing.md's Layout does not name harness modules {missing_layout}"
    assert not missing_design, f"DESIGN.md §3 does not name harness modules {missing_design}"


# ---- CHANGELOG.md ---------------------------------------------------------------------------

def test_changelog_has_every_results_schema_version():
    """Every version the SCHEMA comment of harness/results.py notes, newest first, the newest
    the code's."""
    from harness import results
    source = (ROOT / "harness" / "results.py").read_text()
    block = source[source.index("SCHEMA = "):source.index("\n\n", source.index("SCHEMA = "))]
    noted = re.findall(r"# (2\.\d+):", block)
    listed = re.findall(r"^\* \*\*(\d+(?:\.\d+)?)\*\*", CHANGELOG, re.M)
    assert noted and set(noted) <= set(listed), sorted(set(noted) - set(listed), key=results.minor)
    assert listed[0] == results.SCHEMA, listed[:1]
    majors_minors = [results.minor(v) for v in listed]
    assert majors_minors == sorted(majors_minors, reverse=True), listed


# ---- the README routes --------------------------------------------------------------------

def test_readme_routes_in_at_most_150_lines():
    assert len(README.splitlines()) <= 150, len(README.splitlines())


def test_readme_keeps_the_two_commands_it_promises():
    """.ci/run and CI rely on these: `make run` and `make test` on a fresh machine."""
    section = README.split("## Two commands on a fresh machine\n", 1)[1].split("\n## ", 1)[0]
    commands = [ln.split("#")[0].strip() for ln in section.splitlines() if ln.startswith("    make ")]
    assert commands == ["make run", "make test"], commands


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(text: str) -> list[str]:
    return LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S))


def test_the_four_tasks_are_one_step_from_the_readmes_first_screen():
    """Run (the README itself), tune, several nodes or Slurm, submit: linked in its first 25 lines."""
    first = _links("\n".join(README.splitlines()[:25]))
    assert "make run" in README.split("## Two commands", 1)[1][:400]
    for target in ("docs/tuning.md", "docs/running.md#several-nodes", "docs/running.md#slurm",
                   "docs/submitting.md"):
        assert target in first, (target, first)


def test_every_document_is_linked_from_the_readme():
    targets = {t.split("#")[0] for t in _links(README)}
    missing = [_rel(d) for d in [*sorted(DOCS.glob("*.md")), ROOT / "CHANGELOG.md", ROOT / "LICENSE"]
               if _rel(d) not in targets]
    assert not missing, f"README.md links no {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        s = _slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


@pytest.mark.parametrize("doc", [_rel(d) for d in DOCUMENTS])
def test_every_relative_link_and_anchor_exists(doc):
    here = (ROOT / doc).parent
    bad = []
    for link in _links((ROOT / doc).read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (here / path).resolve() if path else ROOT / doc
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text()):
            bad.append(f"{link}: no heading #{anchor}")
    assert not bad, f"{doc}: {bad}"


def test_the_slug_is_githubs():
    assert _slug("What --verify checks") == "what---verify-checks"
    assert _slug("MindSpore's venv") == "mindspores-venv"
    assert _slug("`PMIX_ERR_OUT_OF_RESOURCE` at start") == "pmix_err_out_of_resource-at-start"


# Citations of a document's section in the code: `docs/running.md, "When a rank dies"` (or the README's)
CITATION = re.compile(r"""(?<![\w/])((?:docs/[\w-]+|README)\.md|README),\s*["']([^"'\n]+)["']""")


def test_the_codes_citations_of_documents_name_sections_that_exist():
    files = [ROOT / "Makefile", ROOT / "hpcai500.py", *sorted((ROOT / "harness").rglob("*.py")),
             *sorted((ROOT / "scripts").rglob("*.py")), *sorted((ROOT / "scripts").rglob("*.sh")),
             *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    cited, bad = 0, []
    for f in files:
        for doc, section in CITATION.findall(f.read_text()):
            doc = "README.md" if doc == "README" else doc
            cited += 1
            headings = {h.strip().strip("`") for h in re.findall(r"^#{1,6} (.+)$", (ROOT / doc).read_text(), re.M)} \
                if (ROOT / doc).is_file() else set()
            if section not in headings:
                bad.append(f"{_rel(f)}: {doc}, {section!r}")
    assert cited >= 5 and not bad, bad


# ---- no dated figure in the user documents (issue 68) -------------------------------------

FORBIDDEN = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "this machine": re.compile(r"(?i)\bthis (?:machine|guest|host|build machine|\d+-core\b)"),
    "here": re.compile(r"(?i)\bhere\b"),
    "an issue number": re.compile(r"(?i)\bissues? \d+"),
    "a commit": re.compile(r"(?<![.\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w+-])"),
    "history": re.compile(r"(?i)\b(?:used to|until now|was changed|before it was|at first|no longer appears?)\b"),
}


def _dated(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r} in {text[max(0, m.start() - 40):m.end() + 20]!r}"
            for what, rx in FORBIDDEN.items() for m in rx.finditer(text)]


@pytest.mark.parametrize("doc", USER_DOCUMENTS)
def test_the_user_documents_hold_no_dated_figure(doc):
    found = _dated((ROOT / doc).read_text())
    assert not found, f"{doc}: move these to bench/README.md, the changelog or a commit message: {found}"


def test_the_dated_figure_check_catches_what_it_should_and_no_more():
    for bad in ("2026-11-28, AMD EPYC", "on this machine", "46 s here", "this 2-core machine", "(issue 47)",
                "in tree, 4ab28a5", "fixed in 49a5d10", "no longer appear", "it used to poll", "measured on this guest"):
        assert _dated(bad), bad
    for good in ("Open MPI 5.0.8 and PMIx 6.1.1", "where there is room", "max |w - w_root| <= 1e-6",
                 "Replica consistency = 0.00000000e+00", "openpmix#3886", "schema 2.20", "runs/<id>/",
                 "2 x 27 x Cin", "16 middle blocks", "a node of 8 GPUs", "runs on this node",
                 "those that no longer fit"):
        assert not _dated(good), (good, _dated(good))


# ---- the sample run is the current code's output ------------------------------------------

def test_the_sample_run_verifies_with_the_current_code(monkeypatch):
    """examples/sample-run/ is a real run of the shipped input: --verify re-derives every
    figure and re-renders report.txt line by line with this code, and its input is the file
    shipped now (the check of the input file reads HPCAI500.dat from the repository root)."""
    from harness import results, verify
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    assert verify.main(str(SAMPLE.relative_to(ROOT)), out=out) == 0, out.getvalue()[-2000:]
    assert "input file HPCAI500.dat: SHA-256" in out.getvalue() and out.getvalue().rstrip().endswith("PASSED")
    res = json.loads((SAMPLE / "results.json").read_text())
    assert res["schema"] == results.SCHEMA, "regenerate examples/sample-run (docs/contributing.md)"
    assert res["input"]["text"] == SHIPPED.read_text()
    assert not (ROOT / "compliance_checker.log").exists()


def test_the_readmes_report_excerpt_is_the_sample_run():
    excerpt = README.split("## A report", 1)[1].split("```\n", 2)[1].splitlines()
    report = (SAMPLE / "report.txt").read_text().splitlines()
    assert len(excerpt) >= 8
    for line in excerpt:
        if line.endswith(" [...]"):
            assert any(r.startswith(line[:-len(" [...]")]) for r in report), line
        else:
            assert line in report, line
