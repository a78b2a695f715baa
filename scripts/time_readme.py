"""Time the README's two first-screen commands as a new user runs them, in a fresh clone, and write the
figures the README shows (never typed by hand): results/timings/readme.md.

    python scripts/time_readme.py                 # clone HEAD into a temporary folder, run both commands
    python scripts/time_readme.py --suite-only    # only the test command, in this checkout (its .venv)

Command 1 is timed in two parts, the installs and ``recurvit train`` (read from the run's own
``train_seconds`` and the process's wall time); command 2 is the README's test command with pytest's ten
slowest tests (results/timings/slowest.md). The machine is named in the file (cores, processor, load average before and after): a
figure from a loaded machine says so, and is not a figure for an idle one.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "timings" / "readme.md"
LOADED = 0.5  # load average per core above which the machine was not idle


def _readme_commands() -> list:
    """The two commands of the README's first code block (setup + train, then tests)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    cmds = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(cmds) != 2:
        raise SystemExit(f"the README's first block should hold two commands, found {len(cmds)}")
    return cmds


def _machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown") if Path("/proc/cpuinfo").is_file() \
        else platform.processor()
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _load() -> float:
    return os.getloadavg()[0]


def _timed(cmd: str, cwd: Path) -> tuple:
    t0, load0 = time.perf_counter(), _load()
    res = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - t0, load0, _load(), res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite-only", action="store_true", help="time only the test command, in this checkout")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    setup, tests = _readme_commands()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    lines = [f"Measured by `python scripts/time_readme.py{' --suite-only' if args.suite_only else ''}` at commit "
             f"{commit} on {time.strftime('%Y-%m-%d')}, on {_machine()}.", ""]
    busy = []
    if args.suite_only:
        where = ROOT
    else:
        where = Path(tempfile.mkdtemp(prefix="recurvit-time-")) / "recurvit"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
        install, train = setup.rsplit(" && ", 1)
        secs, l0, l1, res = _timed(install, where)
        if res.returncode:
            raise SystemExit(f"the installs failed: {res.stderr[-500:]}")
        lines.append(f"- command 1, the installs: {secs / 60:.1f} min (load average {l0:.2f} before, {l1:.2f} after)")
        busy += [l0, l1]
        secs, l0, l1, res = _timed(train, where)
        if res.returncode:
            raise SystemExit(f"`{train}` failed: {res.stderr[-500:]}")
        m = re.search(r"train_seconds (\S+)", res.stdout)
        lines.append(f"- command 1, `{train}`: {secs:.0f} s in all, {float(m.group(1)):.0f} s of it training "
                     f"(load average {l0:.2f} before, {l1:.2f} after)")
        busy += [l0, l1]
    secs, l0, l1, res = _timed(f"{tests} -q -p no:cacheprovider --durations=10", where)
    summary = next((ln for ln in reversed(res.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "?")
    lines.append(f"- command 2, `{tests}`: {secs / 60:.1f} min, {summary.strip('= ')} "
                 f"(load average {l0:.2f} before, {l1:.2f} after)")
    busy += [l0, l1]
    slow = re.findall(r"^\d+\.\d+s (?:call|setup|teardown) .*$", res.stdout.split("slowest 10 durations")[-1], re.M)
    if slow:  # beside the summary (the README shows the summary on its first screen)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (args.out.parent / "slowest.md").write_text(
            f"The ten slowest tests of `{tests}` (`python scripts/time_readme.py"
            f"{' --suite-only' if args.suite_only else ''}` at commit {commit} on {time.strftime('%Y-%m-%d')}: "
            f"{secs / 60:.1f} min on {_machine()}, load average {busy[0]:.2f} before the first command):\n\n"
            "```text\n" + "\n".join(slow[:10]) + "\n```\n")
    cores = os.cpu_count() or 1
    if busy[0] / cores > LOADED:  # later readings include the commands' own load: the first one says whether
        lines.insert(1, f"**Loaded machine** (load average {busy[0]:.2f} on {cores} cores before the first command): "
                        "these are not figures for an idle one.")  # other work shared the machine
    lines.append("")
    lines.append(f"The load averages after the first include the measured commands' own work (on {cores} cores).")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
