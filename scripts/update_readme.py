"""Copy generated result tables into README.md between markers; never type figures by hand.

    python scripts/update_readme.py

Each block ``<!-- include: PATH -->`` ... ``<!-- /include -->`` in README.md is replaced by the
text of PATH (a generated report), with everything from its first image link on left out.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"(<!-- include: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /include -->)", re.S)


def _section(path: Path) -> str:
    text = path.read_text()
    text = text.split("\n![", 1)[0].rstrip()
    lines = [ln for ln in text.splitlines() if not ln.startswith("# ")]
    return "\n".join(lines).strip() + "\n"


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = PATTERN.sub(lambda m: m.group(1) + _section(ROOT / m.group("path")) + m.group(4), text)
    readme.write_text(new)
    print(f"updated {readme} ({len(PATTERN.findall(text))} blocks)")


if __name__ == "__main__":
    main()
