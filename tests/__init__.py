"""The tests mirror the package: tests/<package>/test_<module>.py tests src/recurvit/<package>/<module>.py
(nested packages too: tests/models/cores/, tests/tasks/vae/), and tests/test_<module>.py a top-level module
(src/recurvit/cli.py -> tests/test_cli.py). Suites that belong to no one package are in tests/crosscutting/.
tests/crosscutting/test_tests_layout.py holds the layout. Every test folder is a package (this file), so
files of the same name in two folders are told apart (tests.study.test_speed, tests.models.test_speed)."""
