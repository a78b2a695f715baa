"""Copy generated results into README.md between markers; never type figures by hand.

    python scripts/update_readme.py            # rewrite README.md and docs/*.md, print how many blocks changed
    python scripts/update_readme.py --check    # exit 1 if a page is not what its files generate
    options: --readme PATH (only that page), --root DIR (where include paths are resolved, default the
    repo root; links in included text are rewritten to be relative to the page's folder)

A block is two marker lines, each alone on its line:

    <!-- include: PATH [lines=A-B[,C-D...]] [fence=LANG] -->
    ...generated text, replaced on every run...
    <!-- /include -->

The text between the markers becomes the text of PATH (a generated report), with everything from
its first image link (a line starting ``![``) on left out, ``# `` title lines dropped and ``## ``
headings demoted by two levels (``####``). ``lines=A-B`` takes lines A..B of PATH (1-based,
inclusive) before that; several ranges ``lines=1-4,42-43`` are joined by a line ``...``.
``fence=LANG`` puts the selected lines verbatim (no heading or image rules) in a ```LANG code
fence, so the markers stay outside the fence. ``part=A[-B]`` takes the A-th (to B-th) paragraph of PATH
(paragraphs are separated by blank lines; a table is one paragraph), ``part=-1`` its last. ``view=studies`` reads PATH as
results/findings_headline.md (written by scripts/findings.py) and gives the front page's table of the
registered studies: one line a study with what it asked (from its study file's opening comment), its
status, how many claims it registered, how many of them its rules decided and how many reproduced; the
claims themselves stay in the findings page. Unpaired or nested markers, a malformed marker, a missing
PATH, a range beyond its end or a headline this script cannot read: one line on stderr naming the README
line, exit status 2.
"""
import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPEN = re.compile(r"<!-- include: (?P<path>\S+)(?P<opts>(?: [a-z]+=\S+)*) -->")
CLOSE = "<!-- /include -->"
RANGES = re.compile(r"\d+-\d+(?:,\d+-\d+)*")
PART = re.compile(r"-\d+|\d+(?:-\d+)?")
VIEWS = ("studies",)


class IncludeError(Exception):
    pass


def generate(path: Path, lines: str | None = None, fence: str | None = None, part: str | None = None,
             view: str | None = None, root: Path | None = None) -> str:
    """The text a block including ``path`` holds (ends with a newline); ``lines`` as ``1-4,42-43``, ``part``
    as ``2`` or ``2-3``, ``view`` ``studies`` (the registered studies' table, their files under ``root``)."""
    text = path.read_text()
    if view == "studies":
        return studies_table(text, root if root is not None else path.parent.parent)
    if part:
        paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
        a, _, b = part.lstrip("-").partition("-")
        a = len(paragraphs) + 1 - int(a) if part.startswith("-") else int(a)
        b = int(b) if b else a
        if not 1 <= a <= b <= len(paragraphs):
            raise IncludeError(f"part={part} is outside {path.name}'s paragraphs 1-{len(paragraphs)}")
        text = "\n\n".join(paragraphs[a - 1:b]) + "\n"
    if lines:
        all_lines, parts = text.splitlines(), []
        for rng in lines.split(","):
            a, b = map(int, rng.split("-"))
            if not 1 <= a <= b <= len(all_lines):
                raise IncludeError(f"lines={rng} is outside {path.name}'s lines 1-{len(all_lines)}")
            parts.append("\n".join(all_lines[a - 1:b]))
        text = "\n...\n".join(parts)
    if fence:
        body = text.strip("\n")
        ticks = "`" * max([3] + [len(run) + 1 for run in re.findall(r"`{3,}", body)])
        return f"{ticks}{fence}\n{body}\n{ticks}\n"
    text = text.split("\n![", 1)[0] if not text.startswith("![") else ""
    kept = ["###" + ln[1:] if ln.startswith("## ") else ln for ln in text.splitlines() if not ln.startswith("# ")]
    return "\n".join(kept).strip() + "\n"


def _options(opts: str) -> dict:
    found = dict(opt.split("=", 1) for opt in opts.split())
    unknown = set(found) - {"lines", "fence", "part", "view"}
    if unknown:
        raise IncludeError(f"unknown option {sorted(unknown)[0]}= (known: lines=A-B[,C-D], fence=LANG, "
                           f"part=A[-B], view={'|'.join(VIEWS)})")
    if "lines" in found and not RANGES.fullmatch(found["lines"]):
        raise IncludeError(f"lines={found['lines']} is not A-B or A-B,C-D,...")
    if "part" in found and not PART.fullmatch(found["part"]):
        raise IncludeError(f"part={found['part']} is not A, A-B or -A (the A-th from the end)")
    if "view" in found and found["view"] not in VIEWS:
        raise IncludeError(f"view={found['view']} is not one of: {', '.join(VIEWS)}")
    if "view" in found and len(found) > 1:
        raise IncludeError("view= takes the whole file: no lines=, part= or fence= beside it")
    return found


# ---------------------------------------------------------------- the registered studies, one line each
HEADLINE = "**Pre-registered replication**"
NO_STUDY = "No pre-registered study yet"
STUDY = re.compile(r"\[(?P<name>[^\]]+)\]\((?P<link>[^)\s]+)\)|`(?P<bare>[^`]+)`")
TITLE_END = re.compile(r", (?P<status>.*?)(?:\. Its claims, each with its rule committed before any run:"
                       r"|: (?P<n>\d+) claims?, each with its rule committed before any run, decided once every "
                       r"registered run is in.*)$")
CLAIM = re.compile(r"- .*?: (?:\*\*(?P<verdict>[^*]+)\*\*|(?P<pending>pending)$)")
UNDECIDED = ("not separable", "not measured", "pending")  # verdicts a rule reached without deciding
FINDINGS_LINK = "docs/findings.md#registered-studies"
STUDIES_HEAD = ("| registered study | what it asked | claims | decided | reproduced | the other verdicts |\n"
                "|---|---|---|---|---|---|")
STUDIES_NOTE = ("*What it asked*: the first question the study file's opening comment asks (its first sentence "
                "where it asks none), committed with the registration. *Decided*: a verdict other than not "
                "separable at this scale, not measured or pending. Each claim's words, figure and verdict: "
                f"[docs/findings.md]({FINDINGS_LINK}).")


def decided(verdict: str) -> bool:
    return not verdict.startswith(UNDECIDED)


def read_headline(text: str) -> list[dict]:
    """The registered studies of results/findings_headline.md: for each, its results folder ``study``, its
    report ``link`` (None without one), ``status`` and ``verdicts`` (one a claim; ``pending`` for each claim of
    a study whose registered runs are not all in)."""
    if text.startswith(NO_STUDY):
        return []
    if not text.startswith(HEADLINE):
        raise IncludeError(f"not a findings headline (it starts neither with {HEADLINE} nor with {NO_STUDY!r})")
    studies: list[dict] = []
    for line in text.splitlines():
        if line.startswith(HEADLINE):
            name = STUDY.search(line)
            end = TITLE_END.search(line, name.end()) if name else None
            if not name or not end or end.start() != name.end():
                raise IncludeError(f"a study's line of the headline is not as findings.py writes it: {line[:80]}")
            studies.append({"study": name["name"] or name["bare"], "link": name["link"],
                            "status": end["status"], "verdicts": ["pending"] * int(end["n"] or 0)})
        elif line.startswith("- "):
            claim = CLAIM.match(line)
            if not studies or not claim:
                raise IncludeError(f"a claim's line of the headline is not as findings.py writes it: {line[:80]}")
            studies[-1]["verdicts"].append(claim["verdict"] or "pending")
    return studies


def study_files(root: Path) -> dict[Path, Path]:
    """Each study file under ``root``/studies by the results folder it names (``results:``)."""
    import yaml

    found = {}
    for path in sorted((root / "studies").glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue  # not a study this table can name; the study commands say why
        if isinstance(doc, dict) and isinstance(doc.get("results"), str):
            found[(path.parent / doc["results"]).resolve()] = path
    return found


def asked(files: dict[Path, Path], root: Path, study: str) -> str:
    """What a registered study asked: the first question of its study file's opening comment, from its last
    ': ' on (else the comment's first sentence), without '(issue N)' references. The file is the one of
    ``files`` (:func:`study_files`) that writes results/``study``; a registration never changes after its
    commit, so neither does this."""
    path = files.get((root / "results" / study).resolve())
    if path is None:
        raise IncludeError(f"no studies/*.yaml writes its results to results/{study}")
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words = line[1:].strip()
        if not words and comment:
            break  # the comment's first paragraph
        if words:
            comment.append(words)
    text = re.sub(r"\s*\(issue \d+\)", "", " ".join(comment))
    sentences = [s for s in re.split(r"(?<=[.?])\s+(?=[A-Z])", text) if s]
    if not sentences:
        raise IncludeError(f"studies/{path.name} opens with no comment saying what it asks")
    question = next((s.rsplit(": ", 1)[-1] for s in sentences if s.endswith("?")), sentences[0])
    return question[:1].upper() + question[1:]


def _counts(verdicts: list[str]) -> str:
    got = Counter(verdicts)
    return ", ".join(f"{n} {v}" for v, n in sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def studies_table(text: str, root: Path) -> str:
    """The front page's table of the registered studies, read from results/findings_headline.md's text."""
    studies = read_headline(text)
    if not studies:
        return text.strip() + "\n"
    rows, files = [STUDIES_HEAD], study_files(root)
    for s in studies:
        name = f"[{s['study']}]({s['link']})" if s["link"] else f"`{s['study']}`"
        verdicts = s["verdicts"]
        pending = all(v == "pending" for v in verdicts)
        got = ["-", "-"] if pending else [str(sum(map(decided, verdicts))), str(verdicts.count("reproduced"))]
        cells = [f"{name}, {s['status']}", asked(files, root, s["study"]), str(len(verdicts)), *got,
                 _counts([v for v in verdicts if v != "reproduced"])]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n\n" + STUDIES_NOTE + "\n"


LINK = re.compile(r"\]\((?!https?:|#|/)([^)\s]+)\)")


def relink(text: str, prefix: str, root: Path | None = None, source: Path | None = None) -> str:
    """Relative markdown link targets made relative to a page in a sub-folder: written for the repository
    root, ``](results/x.md)`` -> ``](../results/x.md)`` for a page in docs/; a target that exists only
    beside the included file (``](counts.json)`` in results/accounting/report.md) is first made a path
    from the root."""
    def target(link: str) -> str:
        if root is not None and source is not None and not (root / link).exists() and (source.parent / link).exists():
            link = os.path.relpath(source.parent / link, root)
        return link if prefix in ("", ".") else f"{prefix}/{link}"

    return LINK.sub(lambda m: f"]({target(m[1])})", text)


def update(text: str, root: Path, prefix: str = ".") -> tuple[str, int, list[str]]:
    """(new text, number of blocks, ``'line N (PATH)'`` of each block whose body changes); ``prefix``: the
    way from the page's folder to ``root`` (links in the included text are rewritten through it)."""
    out, changed, count = [], [], 0
    block = None  # (line number, path, generated text, old body lines) while inside a block
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        try:
            if stripped.startswith("<!-- include"):
                if block:
                    raise IncludeError(f"include marker inside the block opened at line {block[0]}")
                match = OPEN.fullmatch(stripped)
                if not match:
                    raise IncludeError(f"malformed marker, expected <!-- include: PATH [lines=A-B] [fence=LANG] -->: {stripped}")
                path = root / match["path"]
                if not path.is_file():
                    raise IncludeError(f"include path {match['path']} does not exist under {root}")
                opts = _options(match["opts"])
                body = generate(path, opts.get("lines"), opts.get("fence"), opts.get("part"), opts.get("view"), root)
                block = (number, match["path"], body if opts.get("fence") else relink(body, prefix, root, path), [])
                out.append(line)
            elif stripped.startswith("<!-- /include"):
                if stripped != CLOSE:
                    raise IncludeError(f"malformed marker, expected {CLOSE}: {stripped}")
                if not block:
                    raise IncludeError(f"{CLOSE} without an opening <!-- include: PATH --> before it")
                opened, rel, new, old = block
                count += 1
                if "".join(old) != new:
                    changed.append(f"line {opened} ({rel})")
                out += [new, line]
                block = None
            elif block:
                block[3].append(line)
            else:
                out.append(line)
        except IncludeError as err:
            raise IncludeError(f"line {number}: {err}") from None
    if block:
        raise IncludeError(f"line {block[0]}: <!-- include: {block[1]} ... --> has no closing {CLOSE}")
    return "".join(out), count, changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from what its files generate")
    parser.add_argument("--readme", type=Path, default=None,
                        help="the one file to update (default: README.md and every docs/*.md)")
    parser.add_argument("--root", type=Path, default=ROOT, help="directory include paths are resolved in")
    args = parser.parse_args(argv)
    pages = [args.readme] if args.readme else [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    status = 0
    for page in pages:
        status = max(status, _one(page, args.root, args.check))
    return status


def _one(page: Path, root: Path, check: bool) -> int:
    try:
        text = page.read_text()
        prefix = os.path.relpath(root.resolve(), page.resolve().parent)
        new, count, changed = update(text, root, prefix)
    except (IncludeError, OSError) as err:
        print(f"{page}: {err}", file=sys.stderr)
        return 2
    if check:
        if changed:
            print(f"{page} is out of date in {len(changed)} of {count} include blocks: {', '.join(changed)}; "
                  f"run python scripts/update_readme.py", file=sys.stderr)
            return 1
        print(f"{page}: {count} include blocks up to date")
        return 0
    if new != text:
        page.write_text(new)
    print(f"updated {len(changed)} of {count} include blocks in {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
