"""Copy generated result tables into README.md between markers; never type figures by hand.

    python scripts/update_readme.py

Each block ``<!-- include: PATH -->`` ... ``<!-- /include -->`` in README.md is replaced by the
text of PATH (a generated report), with everything from its first image link on left out;
``<!-- include: PATH lines=A-B -->`` takes lines A..B of it.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"(<!-- include: (?P<path>\S+)(?: lines=(?P<a>\d+)-(?P<b>\d+))? -->\n)(?P<body>.*?)(<!-- /include -->)",
                     re.S)


def _section(path: Path, a=None, b=None) -> str:
    text = path.read_text()
    if a:
        text = "\n".join(text.splitlines()[int(a) - 1:int(b)])
    text = text.split("\n![", 1)[0].rstrip()
    lines = ["###" + ln[1:] if ln.startswith("## ") else ln for ln in text.splitlines() if not ln.startswith("# ")]
    return "\n".join(lines).strip() + "\n"


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = PATTERN.sub(lambda m: m.group(1) + _section(ROOT / m.group("path"), m.group("a"), m.group("b")) + m.group(5), text)
    readme.write_text(new)
    print(f"updated {readme} ({len(PATTERN.findall(text))} blocks)")


if __name__ == "__main__":
    main()
