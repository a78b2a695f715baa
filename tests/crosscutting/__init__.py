"""Suites of no one package: the package's layout and conformance rules (import floors, thin commands, this test
layout), the README's commands and a user's first hour in fresh processes, safety probes over many commands
(input, run, nothing lost), the vocabulary across commands, plots' readability, a task defined outside the
package, the suite's own Ctrl-C, and the scripts and benchmarks checked against the committed files."""
