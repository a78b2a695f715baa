import os
import signal
import time

import pytest
import torch

os.environ.setdefault("TQDM_DISABLE", "1")
# One process: two intra-op threads at most. Under pytest-xdist (`-n auto`, the README's test command) the
# workers are the parallelism, one per core, so each keeps one thread instead of oversubscribing the cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

# Ctrl-C stops the suite. Tests run `recurvit.cli.main([...])` in-process, and main turns a
# KeyboardInterrupt into "interrupted" and exit code 130, as a command should; inside pytest that swallowed
# the user's Ctrl-C. So the signal is remembered here, and the suite stops after the test it arrived in,
# ending every process the tests started (a killed `recurvit study` would otherwise leave its workers).
_INTERRUPTED = []


def _interrupt(signum, frame):
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _descendants(pid: int) -> list:
    """Every process below ``pid`` (read from /proc; empty where there is none)."""
    children = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def end_children(grace: float = 3.0) -> None:
    """SIGTERM every process the test session started, then SIGKILL what is left after ``grace`` seconds."""
    procs = _descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in procs:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + grace
        while sig == signal.SIGTERM and time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in procs):
            time.sleep(0.05)


def pytest_configure(config):
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed suite (timeout, CI) also ends its children


def pytest_unconfigure(config):
    end_children()


@pytest.fixture(autouse=True)
def _stop_on_ctrl_c():
    yield
    if _INTERRUPTED:
        end_children()
        pytest.exit("interrupted: the test suite stops here (every process it started was ended)", returncode=130)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is fastest and immune to a busy machine's thread contention
    (a module takes it for all its tests with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def fails_in_one_line(capsys, argv, *needles) -> str:
    """Run ``recurvit ARGV`` in-process: it must exit 2 with one error line (no traceback) that holds
    every needle; returns the line."""
    from recurvit.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def load_script(relpath: str):
    """A repository script (``scripts/x.py``, ``benchmarks/x.py``) as a module, for what its command line cannot
    reach; the command itself is tested as a user runs it, in a fresh process."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a tiny shape shared by the model tests: 16x16 RGB, 4x4 patches, width 48
TINY = dict(img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=48, num_heads=3)


class gloo_group:
    """``with gloo_group(rank, world, port):`` the body runs as rank ``rank`` of a CPU process group
    (what torchrun's environment would give it), one thread; the group is destroyed after."""

    def __init__(self, rank, world, port):
        self.rank, self.world, self.port = rank, world, port

    def __enter__(self):
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world), LOCAL_RANK=str(self.rank))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.destroy_process_group()
        return False
