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
fence, so the markers stay outside the fence. Unpaired or nested markers, a malformed marker, a
missing PATH or a range beyond its end: one line on stderr naming the README line, exit status 2.
"""
import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPEN = re.compile(r"<!-- include: (?P<path>\S+)(?P<opts>(?: [a-z]+=\S+)*) -->")
CLOSE = "<!-- /include -->"
RANGES = re.compile(r"\d+-\d+(?:,\d+-\d+)*")


class IncludeError(Exception):
    pass


def generate(path: Path, lines: str | None = None, fence: str | None = None) -> str:
    """The text a block including ``path`` holds (ends with a newline); ``lines`` as ``1-4,42-43``."""
    text = path.read_text()
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
    unknown = set(found) - {"lines", "fence"}
    if unknown:
        raise IncludeError(f"unknown option {sorted(unknown)[0]}= (known: lines=A-B[,C-D], fence=LANG)")
    if "lines" in found and not RANGES.fullmatch(found["lines"]):
        raise IncludeError(f"lines={found['lines']} is not A-B or A-B,C-D,...")
    return found


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
                body = generate(path, opts.get("lines"), opts.get("fence"))
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
