"""User Configuration: read and validate HPCAI500.dat, expand the sweep into tests.

Positional like HPL.dat: line N always means the same thing (see LINES); each line
is its value(s) followed by free text, which is ignored. Lines 1-2 are free titles.
A count line (6, 9, 13, 16) says how many values the next line(s) carry: exactly
that many tokens are taken, and the token after them must not look like one more
value. The parser is strict and stops at the first error, raising DatError.
Pure parsing: no MPI here, rank 0 parses and the caller broadcasts the Config.

T/V code (Test.tv), HPL-like, encodes the variant of a test in six fields (TV_FIELDS):
sampler, precision, communication, optimizer, all-reduce, compiler, each with the code
its choice has in CHOICES; e.g. B32C32SR = bootstrap, fp32, fp32 communication, SGD,
ring, no XLA (B32C32SRX with XLA).
The keyword choices live beside what implements them (sampler, train, ensemble,
workloads); this module only reads them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields

from harness import ensemble, frameworks, parallelism, sampler, train, workloads

# The keyword choices of the input file, each table kept beside what implements it:
# name -> (T/V code, meaning); the first name is the default.
CHOICES = {
    "workload": workloads.CHOICES,
    "precision": train.PRECISIONS,
    "optimizer": train.OPTIMIZERS,
    "comm_precision": train.COMMUNICATION,
    "allreduce": train.ALLREDUCE,
    "sampler": sampler.METHODS,
    "aggregation": ensemble.AGGREGATIONS,
    "compiler": train.COMPILERS,
    "framework": frameworks.CHOICES,
}
KNOWN = {kind: tuple(table) for kind, table in CHOICES.items()}
# The line of each single-valued keyword: the parser reads it there, and messages about a
# choice (harness/plan.py) name it.
LINE_OF = {"precision": 17, "optimizer": 18, "comm_precision": 21, "allreduce": 22, "sampler": 23, "aggregation": 24, "compiler": 33}
# What each option a tuning run may vary (--tune, harness/tune.py) changes, stated once here where
# the lines are read: Config field -> (its values' line, kind). "speed": how fast the same training
# runs, not what it learns (a tuning run decides it by short timed probes of FLOPS); "quality": what
# is learnt (decided on VFLOPS by multi-fidelity tuning). The framework is a speed knob: each builds
# the same reference model (docs/frameworks.md). The sweep lines (10-11, 14, 17, 35, 37) list values
# in any run; the single-valued ones (SINGLE) may list several under --tune only.
KNOBS = {"layouts": (10, "quality"), "pmap": (12, "speed"), "batch_sizes": (14, "quality"),
         "precisions": (17, "quality"), "optimizer": (18, "quality"), "base_lr": (19, "quality"),
         "warmup_epochs": (20, "quality"), "comm_precision": (21, "quality"), "allreduce": (22, "speed"),
         "staging": (28, "speed"), "compiler": (33, "speed"), "frameworks": (35, "speed"), "modes": (37, "quality")}
SINGLE = ("pmap", "optimizer", "base_lr", "warmup_epochs", "comm_precision", "allreduce", "staging", "compiler")
MAX_REPETITIONS = 100
MAX_BYTES = 1 << 20
NLINES = 37
# Lines added since the first release: first line -> what brought it. A file that ends
# before one of them predates it (and everything after it).
ADDED = {31: "time to quality", 33: "the compiler line", 34: "the framework lines", 36: "the parallel-mode lines"}
FIRST_NEW = min(ADDED)
_ONE_OF = {kind: ", ".join(names) for kind, names in KNOWN.items()}
LINES = (None,  # what line N holds, 1-based (used when the file is short)
    "a title line", "a title line", "output file name", "device out (6=stdout,7=stderr,file)",
    "results directory", "# of workloads", f"workloads ({_ONE_OF['workload']})",
    "dataset (embedded, synthetic[:SAMPLES[:SIDE]], or a path)",
    "# of ensemble layouts (M x P)", "Ms (base models; 0 = world size / P)",
    "Ps (P_degree: ranks per base model)", "PMAP job mapping (0=node-packed, 1=round-robin)",
    "# of batch sizes", "Bs (per-rank batch size)", "epochs", "# of training precisions",
    f"PRECs ({_ONE_OF['precision']})", f"optimizer ({_ONE_OF['optimizer']})",
    "base learning rate", "warm-up epochs", f"communication precision ({_ONE_OF['comm_precision']})",
    f"all-reduce ({_ONE_OF['allreduce']})", f"sampler ({_ONE_OF['sampler']})",
    f"aggregation ({_ONE_OF['aggregation']})", "target quality (-1 = workload default)",
    "penalty exponent n (-1 = workload default)", f"repetitions (1 to {MAX_REPETITIONS})",
    "staging directory (none, or a node-local path [keep])", "seed",
    "roofline micro-kernels (0=skip, 1=run)",
    "evaluate every K epochs (0 = only at the end)",
    "stop at target (0=no, 1=at the first evaluation that reaches it)",
    f"compiler ({_ONE_OF['compiler']})", "# of frameworks", f"frameworks ({_ONE_OF['framework']})",
    "# of parallel modes", f"parallel modes ({parallelism.FORM})")
# What to add to a file that predates lines 31-37: the shipped file's lines (value, then LINES' text).
NEW_LINES = (f"{'1':<13} {LINES[31]}", f"{'0':<13} {LINES[32]}", f"{'none':<13} {LINES[33]}",
             f"{'1':<13} {LINES[34]}", f"{frameworks.DEFAULT:<13} {LINES[35]}", f"{'1':<13} {LINES[36]}",
             f"{'data':<13} {LINES[37]}")
# The T/V code's fields, in order (Test.tv); the report prints "T/V : Encoded variant ({TV_LEGEND})"
# (XLA's code is empty for none, TensorFlow's for the framework, data parallelism's for the
# mode: codes from before lines 33-37 read as they did). The mode's field is parallelism.code's.
TV_FIELDS = (("sampler", "sampler"), ("precision", "prec"), ("comm_precision", "comm"), ("optimizer", "opt"),
             ("allreduce", "AR"), ("compiler", "XLA"), ("framework", "FW"))


def tv_legend(framework_codes) -> str:
    """The T/V legend with the frameworks' codes `framework_codes` (the registry's, in its order)."""
    codes = {**{kind: [code for code, _ in CHOICES[kind].values()] for kind, _ in TV_FIELDS},
             "framework": list(framework_codes)}
    return ", ".join(f"{short} {'|'.join(code or '(none)' for code in codes[kind])}"
                     for kind, short in TV_FIELDS) + ", mode (none)|MP|PP<m>|GP<m>|<S>SPP<m>|<S>SGP<m>"


TV_LEGEND = tv_legend(code for code, _ in frameworks.CHOICES.values())
# A results file from before schema 2.13 does not record its legend: its report printed the
# one of the two frameworks then built, TensorFlow's (none) and PyTorch's PT (--verify)
TV_LEGEND_BEFORE_2_13 = tv_legend(("", "PT"))
SEED_MAX = 2**32 - 1
_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")


class _Bare(str):
    """A 'found' description printed without quotes (end of file, an empty line)."""
    def __repr__(self):
        return str(self)


class DatError(ValueError):
    """One-line error: '<path>:<line>: found <token>, expected <what>'."""
    def __init__(self, path, line_no, found, expected):
        self.path, self.line_no, self.found, self.expected = path, line_no, found, expected
        super().__init__(f"{path}:{line_no}: found {found!r}, expected {expected}")


@dataclass(frozen=True)
class Config:
    """The whole parsed file (keywords lowercase; -1 = workload default)."""
    path: str                             # as given to parse()
    text: str                             # the file verbatim (for results.json)
    output_file: str                      # line 3
    device_out: int                       # line 4: 6 stdout, 7 stderr, else output_file
    results_dir: str                      # line 5
    workloads: tuple[str, ...]            # lines 6-7
    dataset: workloads.Dataset            # line 8: embedded | synthetic[:S[:SIDE]] | path, parsed
    layouts: tuple[tuple[int, int], ...]  # lines 9-11: (M, P), M = 0: world size / P
    pmap: int                             # line 12: 0 node-packed, 1 round-robin
    batch_sizes: tuple[int, ...]          # lines 13-14, per rank
    epochs: int                           # line 15
    precisions: tuple[str, ...]           # lines 16-17
    optimizer: str                        # line 18
    base_lr: float                        # line 19, per rank, x P
    warmup_epochs: float                  # line 20, <= epochs
    comm_precision: str                   # line 21
    allreduce: str                        # line 22
    sampler: str                          # line 23
    aggregation: str                      # line 24
    target_quality: float                 # line 25
    penalty_n: float                      # line 26
    repetitions: int                      # line 27
    staging: str                          # line 28: 'none' or a path
    seed: int                             # line 29
    roofline: int                         # line 30
    eval_every: int = 0                   # line 31: evaluate every K epochs (epochs); 0 = at the end only
    stop_at_target: bool = False          # line 32: stop at the first evaluation that reaches the target
    compiler: str = "none"                # line 33: xla (TensorFlow), inductor (PyTorch's torch.compile):
    #                                       the training step's forward and backward compiled
    frameworks: tuple[str, ...] = (frameworks.DEFAULT,)  # lines 34-35
    modes: tuple[str, ...] = ("data",)    # lines 36-37: parallel modes as written (harness/parallelism.py)
    staging_keep: bool = False            # line 28's optional 'keep': copies stay after a test
    alternatives: tuple = ()              # --tune: ((field, (value, ...)), ...) for each line of SINGLE listing
    #                                       several values (the field holds the first); () in any other run


@dataclass(frozen=True)
class Test:
    """One combination of the sweep; index is 1-based in sweep order."""
    index: int
    workload: str
    M: int  # as given: 0 is resolved by the topology
    P: int
    batch: int
    precision: str
    framework: str = frameworks.DEFAULT
    mode: str = "data"       # line 37's value, as written

    def tv(self, cfg: Config) -> str:
        value = {**vars(cfg), "precision": self.precision, "framework": self.framework}
        return ("".join(CHOICES[kind][value[kind]][0] for kind, _ in TV_FIELDS)
                + parallelism.code(parallelism.parse(self.mode), self.P, self.batch))


def _n(k, noun):
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _int(tok):
    return int(tok) if _INT.match(tok) else None


def _num(tok):
    v = float(tok) if _FLOAT.match(tok) else None
    return v if v is not None and math.isfinite(v) else None


class _Reader:
    def __init__(self, text, path, tune=False):
        self.path, self.tune = path, tune
        self.alternatives = {}   # field -> its values, for a line of SINGLE listing several (--tune)
        self.lines = [ln.rstrip("\r") for ln in text.split("\n")]
        if self.lines[-1] == "":
            self.lines.pop()

    def err(self, n, found, expected):
        return DatError(self.path, n, found, expected)

    def tokens(self, n):
        if n > len(self.lines):
            raise self.err(n, _Bare("end of file"), f"line {n}: {LINES[n]}")
        return self.lines[n - 1].split()

    def first(self, n, what):
        toks = self.tokens(n)
        if not toks:
            raise self.err(n, _Bare("an empty line"), what)
        return toks[0]

    def number(self, n, what, ok, conv=_int):
        tok = self.first(n, what)
        v = conv(tok)
        if v is None or not ok(v):
            raise self.err(n, tok, what)
        return v

    def keyword(self, n, kind, label, article="a"):
        what = f"{article} {label} ({', '.join(KNOWN[kind])})"
        tok = self.first(n, what)
        if tok.lower() not in KNOWN[kind]:
            raise self.err(n, tok, what)
        return tok.lower()

    def values(self, n, count_line, what, conv, looks):
        """The values of line n, as many as line count_line says (an integer >= 1).
        conv(tok) -> value or None if invalid (or DatError naming what in tok is wrong);
        looks(tok): tok would be one more value."""
        count = self.number(count_line, f"a {LINES[count_line]}: an integer >= 1",
                            lambda v: v >= 1)
        toks, out = self.tokens(n), []
        for i in range(count):
            where = f" as value {i + 1} of {count} (line {count_line} says {count})" \
                if count > 1 else ""
            if i >= len(toks):
                if not toks:
                    raise self.err(n, _Bare("an empty line"), what + where)
                raise self.err(n, " ".join(toks), f"{what}{where}: the line holds only {_n(i, 'value')}")
            v = conv(toks[i])
            if v is None:
                raise self.err(n, toks[i], what + where)
            out.append(v)
        extra = 0
        while count + extra < len(toks) and looks(toks[count + extra]):
            extra += 1
        if extra:
            raise self.err(n, toks[count], f"{_n(count, 'value')}, as line {count_line} says "
                           f"(count says {count} but found {count + extra} values)")
        return out

    def ints(self, n, count_line, what, ok):
        return self.values(n, count_line, what, lambda t: v if (v := _int(t)) is not None
                           and ok(v) else None, lambda t: _int(t) is not None)

    def keywords(self, n, count_line, kind, label):
        """Keyword sweep: known, each once; lowercase."""
        vals = self.values(n, count_line, f"a {label} ({', '.join(KNOWN[kind])})",
                           lambda t: t.lower() if t.lower() in KNOWN[kind] else None,
                           lambda t: t.lower() in KNOWN[kind])
        self.unique(n, vals, label)
        return tuple(vals)

    def listed(self, n, field, first, conv, what):
        """Line n's values after its first (`conv(tok)`: a value, or None where the free text
        begins): under --tune a search space (self.alternatives), each value once; in any other
        run refused, as a run would train the first alone."""
        toks, vals = self.tokens(n), [first]
        for tok in toks[1:]:
            v = conv(tok)
            if v is None:
                break
            vals.append(v)
        if len(vals) == 1:
            return
        if not self.tune:
            raise self.err(n, toks[1], f"{what} alone after {toks[0]!r} (several values are a search space, read"
                           " by --tune only)")
        self.unique(n, vals, what)
        self.alternatives[field] = tuple(vals)

    def unique(self, n, vals, what):
        for i, v in enumerate(vals):
            if v in vals[:i]:
                raise self.err(n, self.tokens(n)[i], f"each {what} once ({v!r} is listed twice)")


def _dataset(r: _Reader, n: int) -> workloads.Dataset:
    what = f"a dataset ({workloads.DATASET_FORM})"
    tok = r.first(n, what)
    try:
        return workloads.Dataset.parse(tok)
    except ValueError:
        raise r.err(n, tok, what) from None


def record(cfg: Config) -> dict:
    """The configuration as results.json keeps it: every field but the file's text (kept
    apart), the dataset as its text, tuples as lists."""
    out = {f.name: getattr(cfg, f.name) for f in fields(Config) if f.name != "text"}
    out["dataset"] = cfg.dataset.text
    if not cfg.alternatives:   # a tuning run's only (--tune): any other record reads as before schema 2.21
        del out["alternatives"]
    return json.loads(json.dumps(out))


def from_record(text: str, recorded: dict) -> Config:
    """A Config from results.json's `config` (for --verify, when the recorded text no
    longer parses); TypeError if the record is not a configuration."""
    known = {f.name for f in fields(Config)} - {"text"}
    deep = lambda v: tuple(map(deep, v)) if isinstance(v, list) else v  # noqa: E731  (JSON's lists: the tuples)
    values = {k: deep(v) for k, v in recorded.items() if k in known}
    values["dataset"] = workloads.Dataset.parse(str(values.get("dataset", "")))
    return Config(text=text, **values)


def _added_lines(r: _Reader) -> None:
    """A file that ends before a line of ADDED (the lines after it empty or absent)
    predates that line: say so and what to add, rather than 'end of file' at one line."""
    last = max((n for n, ln in enumerate(r.lines, 1) if ln.strip()), default=0)
    for first, what in sorted(ADDED.items()):
        if last == first - 1:
            add = NEW_LINES[first - FIRST_NEW:]
            span = f"line {first}" if first == NLINES else f"lines {first}-{NLINES}"
            raise r.err(first, _Bare("end of file"), f"{span} (an input file from before {what} has {last} lines); "
                        f"add {'it' if len(add) == 1 else 'them'}, e.g. " + " and ".join(map(repr, add)))


def _recipe_lines(r: _Reader, epochs: int) -> dict:
    """Lines 18-24: the optimizer, learning rate and warm-up, the exchange, sampler and
    aggregation (lines 18-22 may list a --tune search space: _Reader.listed)."""
    optimizer = r.keyword(LINE_OF["optimizer"], "optimizer", "optimizer", "an")
    r.listed(LINE_OF["optimizer"], "optimizer", optimizer, _known("optimizer"), "an optimizer")
    base_lr = r.number(19, "a base learning rate: a number > 0", lambda v: v > 0, _num)
    r.listed(19, "base_lr", base_lr, lambda t: v if (v := _num(t)) is not None and v > 0 else None,
             "a base learning rate")
    warmup = r.number(20, f"warm-up epochs: a number >= 0 and <= epochs ({epochs}, line 15)",
                      lambda v: 0 <= v <= epochs, _num)
    r.listed(20, "warmup_epochs", warmup, lambda t: v if (v := _num(t)) is not None and 0 <= v <= epochs else None,
             "a number of warm-up epochs")
    comm_precision = r.keyword(LINE_OF["comm_precision"], "comm_precision", "communication precision")
    r.listed(LINE_OF["comm_precision"], "comm_precision", comm_precision, _known("comm_precision"),
             "a communication precision")
    allreduce = r.keyword(LINE_OF["allreduce"], "allreduce", "all-reduce", "an")
    r.listed(LINE_OF["allreduce"], "allreduce", allreduce, _known("allreduce"), "an all-reduce")
    sampler = r.keyword(LINE_OF["sampler"], "sampler", "sampler")
    aggregation = r.keyword(LINE_OF["aggregation"], "aggregation", "aggregation", "an")
    return {"optimizer": optimizer, "base_lr": base_lr, "warmup_epochs": warmup, "comm_precision": comm_precision,
            "allreduce": allreduce, "sampler": sampler, "aggregation": aggregation}


def _known(kind: str):
    """A token's keyword of `kind` (lowercase), or None: listed's reading of a keyword line."""
    return lambda tok: tok.lower() if tok.lower() in KNOWN[kind] else None


def parse_text(text: str, path: str = "HPCAI500.dat", tune: bool = False) -> Config:
    """Validate the text of an input file; raises DatError at the first error. `tune`: a
    tuning run's (--tune), where the lines of SINGLE may list several values."""
    r = _Reader(text, path, tune)
    r.tokens(1), r.tokens(2)  # free title lines, but they must be there
    output_file = r.first(3, "an output file name")
    device_out = r.number(4, "a device out: an integer >= 0 (6=stdout, 7=stderr, "
                          "other=the file on line 3)", lambda v: v >= 0)
    results_dir = r.first(5, "a results directory")
    workloads = r.keywords(7, 6, "workload", "workload")
    dataset = _dataset(r, 8)
    ms = r.ints(10, 9, "an M: an integer >= 0 (0 = world size / P)", lambda v: v >= 0)
    ps = r.ints(11, 9, "a P: an integer >= 1", lambda v: v >= 1)
    layouts = tuple(zip(ms, ps))
    r.unique(11, layouts, "(M, P) layout")
    pmap = r.number(12, "a PMAP: 0 (node-packed) or 1 (round-robin)", lambda v: v in (0, 1))
    r.listed(12, "pmap", pmap, lambda t: v if (v := _int(t)) in (0, 1) else None, "a PMAP")
    batch_sizes = tuple(r.ints(14, 13, "a batch size: an integer >= 1", lambda v: v >= 1))
    r.unique(14, batch_sizes, "batch size")
    epochs = r.number(15, "epochs: an integer >= 1", lambda v: v >= 1)
    precisions = r.keywords(17, 16, "precision", "training precision")
    recipe = _recipe_lines(r, epochs)
    target = r.number(25, "a target quality: -1 (workload default) or a number in (0, 1]",
                      lambda v: v == -1 or 0 < v <= 1, _num)
    penalty_n = r.number(26, "a penalty exponent n: -1 (workload default) or a number >= 0",
                         lambda v: v == -1 or v >= 0, _num)
    repetitions = r.number(27, f"repetitions: an integer from 1 to {MAX_REPETITIONS}",
                           lambda v: 1 <= v <= MAX_REPETITIONS)
    tok = r.first(28, "a staging directory (none, or a node-local path [keep])")
    staging = "none" if tok.lower() == "none" else tok
    # an optional second value 'keep': leave the staged copies in place after each test
    staging_keep = staging != "none" and len(r.tokens(28)) > 1 and r.tokens(28)[1].lower() == "keep"
    if r.tune:   # a search space: none and node-local paths ('keep' after a path keeps every path's copies)
        paths = [t for t in r.tokens(28) if t.lower() == "none" or t.startswith(("/", ".", "~"))]
        staging_keep = staging_keep or "keep" in [t.lower() for t in r.tokens(28)[1:3]]
        r.listed(28, "staging", staging, lambda t: ("none" if t.lower() == "none" else t) if t in paths else None,
                 "a staging directory")
    seed = r.number(29, f"a seed: an integer in [0, {SEED_MAX}]", lambda v: 0 <= v <= SEED_MAX)
    roofline = r.number(30, "roofline micro-kernels: 0 (skip) or 1 (run)", lambda v: v in (0, 1))
    _added_lines(r)
    eval_every = r.number(31, "evaluate every K epochs: an integer >= 0 (0 = only at the end)", lambda v: v >= 0)
    stop_at_target = bool(r.number(32, "stop at target: 0 (no) or 1 (at the first evaluation that reaches it)",
                                   lambda v: v in (0, 1)))
    compiler = r.keyword(LINE_OF["compiler"], "compiler", "compiler")
    r.listed(LINE_OF["compiler"], "compiler", compiler, _known("compiler"), "a compiler")
    frameworks = r.keywords(35, 34, "framework", "framework")
    modes = _modes(r)
    for n in range(NLINES + 1, len(r.lines) + 1):
        if r.lines[n - 1].strip():
            raise r.err(n, r.lines[n - 1].split()[0], f"end of file (unexpected line {n}: "
                        f"the input has {NLINES} lines)")
    return Config(
        path=path, text=text, output_file=output_file, device_out=device_out,
        results_dir=results_dir, workloads=workloads, dataset=dataset, layouts=layouts,
        pmap=pmap, batch_sizes=batch_sizes, epochs=epochs, precisions=precisions, **recipe, target_quality=target, penalty_n=penalty_n,
        repetitions=repetitions, staging=staging, seed=seed, roofline=roofline,
        eval_every=eval_every, stop_at_target=stop_at_target, staging_keep=staging_keep, compiler=compiler,
        frameworks=frameworks, modes=modes, alternatives=tuple(r.alternatives.items()))


def _modes(r: _Reader) -> tuple[str, ...]:
    """Lines 36-37: the parallel modes, each of parallelism.FORM, each once (lowercase)."""
    def mode(tok):   # the part of the token that is wrong, named (parallelism.ModeError)
        try:
            return parallelism.parse(tok).text
        except parallelism.ModeError as e:
            if not e.role:   # no mode at all (its keyword unknown): the grammar, value i of the count
                return None
            raise r.err(37, _Bare(e.found(tok)), e.expected) from None

    def looks(tok):
        try:
            return bool(parallelism.parse(tok))
        except parallelism.ModeError:
            return False
    vals = r.values(37, 36, f"a parallel mode ({parallelism.FORM})", mode, looks)
    r.unique(37, vals, "parallel mode")
    return tuple(vals)


def parse(path: str, tune: bool = False) -> Config:
    """Read `path` (UTF-8, at most 1 MiB) and parse it (parse_text); reading errors are line 0."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise DatError(path, 0, _Bare("a directory"), "an HPCAI500.dat input file") from None
    except FileNotFoundError:
        raise DatError(path, 0, _Bare("no such file"), "an HPCAI500.dat input file") from None
    except OSError as e:
        raise DatError(path, 0, _Bare(f"an unreadable file ({e.strerror or e})"),
                       "a readable HPCAI500.dat input file") from None
    if len(data) > MAX_BYTES:
        raise DatError(path, 0, _Bare("a file over 1 MiB"), "an HPCAI500.dat input file "
                       "(at most 1 MiB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DatError(path, 0, _Bare(f"a non-UTF-8 byte {data[e.start]:#04x} on line {line}"),
                       "UTF-8 text") from None
    return parse_text(text.removeprefix("\ufeff"), path, tune)


def expand(cfg: Config) -> list[Test]:
    """One Test per combination: workload (outer), layout, batch, precision, framework, mode
    (inner: the same test in each framework, then in each parallel mode, side by side)."""
    combos = [(w, m, p, b, pr, fw, mode) for w in cfg.workloads for m, p in cfg.layouts
              for b in cfg.batch_sizes for pr in cfg.precisions for fw in cfg.frameworks for mode in cfg.modes]
    return [Test(i, *c) for i, c in enumerate(combos, 1)]


# Before results schema 2.13 the COMPILER line said how both frameworks of the time run without
# a compiler, whatever line 35 named (--verify re-renders an earlier run's so)
COMPILER_NONE_BEFORE_2_13 = "none (TensorFlow: graph, tf.function; PyTorch: eager)"


def describe(cfg: Config, schema: tuple[int, int] | None = None) -> list[str]:
    """HPL-like 'The following parameter values will be used:' lines, as results schema
    `schema` wrote them (None: today's; --verify passes an earlier run's)."""
    w = max(len(str(v)) for lay in cfg.layouts for v in lay)
    dflt = lambda v: "workload default" if v == -1 else f"{v:g}"  # noqa: E731
    dev = {6: "stdout", 7: "stderr"}.get(cfg.device_out, f"file {cfg.output_file}")
    rows = [("WL", " ".join(cfg.workloads)), ("DATASET", cfg.dataset.text),
            ("M", " ".join(f"{m:>{w}}" for m, _ in cfg.layouts)),
            ("P", " ".join(f"{p:>{w}}" for _, p in cfg.layouts)),
            ("PMAP", ("Node-packed", "Round-robin")[cfg.pmap]),
            ("B", " ".join(map(str, cfg.batch_sizes))), ("EPOCHS", str(cfg.epochs)),
            ("PREC", " ".join(cfg.precisions)), ("OPTIM", cfg.optimizer),
            ("LR", f"{cfg.base_lr:g} per rank, x P (linear scaling)"),
            ("WARMUP", f"{cfg.warmup_epochs:g} epochs"), ("COMM", cfg.comm_precision),
            ("ALLRED", cfg.allreduce), ("SAMPLER", cfg.sampler), ("AGGR", cfg.aggregation),
            ("TARGET", dflt(cfg.target_quality)), ("N", dflt(cfg.penalty_n)),
            ("REPS", str(cfg.repetitions)), ("STAGING", cfg.staging if cfg.staging == "none" else
                         f"{cfg.staging} (one node-local copy per node of the union of its jobs' resamples, "
                         f"{'kept' if cfg.staging_keep else 'removed'} after each test)"), ("SEED", str(cfg.seed)),
            ("ROOFLINE", ("skip", "run")[cfg.roofline]),
            ("EVAL", "at the end only" if not cfg.eval_every else f"every {_n(cfg.eval_every, 'epoch')} and at the end"),
            ("STOP", "at the first evaluation that reaches the target" if cfg.stop_at_target
                     else f"after epoch {cfg.epochs} (line 15)"),
            ("COMPILER", COMPILER_NONE_BEFORE_2_13 if cfg.compiler == "none" and schema and schema < (2, 13) else
                         frameworks.compiler_words(cfg.compiler, cfg.frameworks)),
            ("FRAMEWRK", " ".join(cfg.frameworks)),
            ("PARMODE", " ".join(cfg.modes)),
            ("OUTPUT", dev),
            ("RESULTS", cfg.results_dir)]
    also = {ROW_OF[f]: " ".join(_token(v) for v in vals[1:]) for f, vals in cfg.alternatives}   # --tune's lists
    return [f"{k:<8}: {v}" + (f" (--tune also: {also[k]})" if k in also else "") for k, v in rows]


# The parameter row of each line of SINGLE (describe)
ROW_OF = {"pmap": "PMAP", "optimizer": "OPTIM", "base_lr": "LR", "warmup_epochs": "WARMUP", "comm_precision": "COMM",
          "allreduce": "ALLRED", "staging": "STAGING", "compiler": "COMPILER"}


def _token(value) -> str:
    """A value as the input file writes it (a number with %g)."""
    return f"{value:g}" if isinstance(value, float) else str(value)
